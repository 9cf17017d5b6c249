"""Write the C source of the cffi API-mode extension `swarmkv._native._llama`.

CMake runs `python build_ffi.py --emit OUT.c` and compiles OUT.c against the pinned headers
(see CMakeLists.txt), so every declaration in cdef.h is checked by the C compiler.
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

import cffi

HERE = Path(__file__).resolve().parent
LOCK = HERE.parent.parent / "vendor" / "llama.cpp.lock"


def pinned_commit() -> str:
    with LOCK.open("rb") as f:
        commit = tomllib.load(f)["commit"]
    if not (len(commit) == 40 and all(c in "0123456789abcdef" for c in commit)):
        raise SystemExit(f"build_ffi: bad commit {commit!r} in {LOCK}")
    return str(commit)


def make_ffi() -> cffi.FFI:
    ffi = cffi.FFI()
    ffi.cdef((HERE / "cdef.h").read_text())
    source = f"""
#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"
static const char * swarmkv_llama_cpp_commit(void) {{ return "{pinned_commit()}"; }}
"""
    ffi.set_source("swarmkv._native._llama", source)
    return ffi


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--emit", required=True, type=Path, help="where to write the C source")
    args = parser.parse_args()
    make_ffi().emit_c_code(str(args.emit))


if __name__ == "__main__":
    main()
