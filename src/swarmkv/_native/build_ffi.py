"""Write the C source of the cffi API-mode extension `swarmkv._native._llama`.

CMake runs `python build_ffi.py --emit OUT.c --cpu MODE ...` and compiles OUT.c against the
pinned headers (see CMakeLists.txt), so every declaration in cdef.h is checked by the C
compiler. The build's own settings (CPU mode, CUDA and why, AMX, backends, patches applied)
are compiled in as one JSON string, so `swarmkv info` reports what was built, not a guess.
"""

from __future__ import annotations

import argparse
import json
import tomllib
from pathlib import Path

import cffi

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]  # src/swarmkv/_native -> the repository root
LOCK = ROOT / "vendor" / "llama.cpp.lock"
STAMP = ROOT / "vendor" / "llama.cpp" / ".swarmkv-stamp"


def pinned_commit() -> str:
    """The llama.cpp commit pinned in vendor/llama.cpp.lock.

    Exits (SystemExit) when it is not 40 lowercase hex digits.
    """
    with LOCK.open("rb") as f:
        commit = tomllib.load(f)["commit"]
    if not (len(commit) == 40 and all(c in "0123456789abcdef" for c in commit)):
        raise SystemExit(f"build_ffi: bad commit {commit!r} in {LOCK}")
    return str(commit)


def applied_patches() -> list[str]:
    """`name:sha256-prefix` of every patch in the tree, as the fetch script stamped it."""
    # Stamp: "package==version sha256 commit name:hash,name:hash" (no patches: 3 fields).
    fields = STAMP.read_text().split()
    return [p for p in fields[3].split(",") if p] if len(fields) == 4 else []


def build_info(args: argparse.Namespace) -> dict[str, object]:
    """The build's settings from the command line, compiled into the extension as JSON."""
    return {
        "cpu_mode": args.cpu,
        "cuda": args.cuda == "ON",
        "cuda_reason": args.cuda_reason,
        "amx_opt_in": args.amx == "ON",
        "backend_libraries": [b for b in args.backends.split(",") if b],
        # portable builds: the CPU variants asked for (SWARMKV_CPU_VARIANTS); empty: all
        "cpu_variants_requested": [v for v in args.cpu_variants.split(",") if v],
        "patches": applied_patches(),
    }


# peak.c's functions (the benchmarks' hardware floors), compiled into the extension itself
PEAK_CDEF = """
const char * swarmkv_peak_int8_isa(void);
const char * swarmkv_peak_fma_isa(void);
int64_t swarmkv_peak_int8(int64_t iters);
int64_t swarmkv_peak_fma(int64_t iters);
int64_t swarmkv_peak_read(const void * buf, size_t bytes, int passes);
"""


def make_ffi(args: argparse.Namespace) -> cffi.FFI:
    """The cffi FFI of swarmkv._native._llama: cdef.h and cdef_graph.h (plus cdef_cpu.h for a
    native CPU build).

    Its C source adds swarmkv_llama_cpp_commit(), swarmkv_build_json() and peak.c.
    """
    ffi = cffi.FFI()
    cdef = (HERE / "cdef.h").read_text() + (HERE / "cdef_graph.h").read_text() + PEAK_CDEF
    if args.cpu == "native":
        cdef += (HERE / "cdef_cpu.h").read_text()
    ffi.cdef(cdef)
    info = json.dumps(json.dumps(build_info(args)))  # a C string literal of the JSON text
    source = f"""
#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
static const char * swarmkv_llama_cpp_commit(void) {{ return "{pinned_commit()}"; }}
static const char * swarmkv_build_json(void) {{ return {info}; }}
""" + (HERE / "peak.c").read_text()
    ffi.set_source("swarmkv._native._llama", source)
    return ffi


def main() -> None:
    """Parse the options CMake passes and write the extension's C source to --emit."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--emit", required=True, type=Path, help="where to write the C source")
    parser.add_argument("--cpu", choices=["native", "portable"], default="native")
    parser.add_argument("--cuda", choices=["ON", "OFF"], default="OFF")
    parser.add_argument("--amx", choices=["ON", "OFF"], default="OFF")
    parser.add_argument("--cuda-reason", default="")
    parser.add_argument("--backends", default="", help="backend libraries built, comma-separated")
    parser.add_argument("--cpu-variants", default="", help="CPU variants asked for (portable)")
    args = parser.parse_args()
    make_ffi(args).emit_c_code(str(args.emit))


if __name__ == "__main__":
    main()
