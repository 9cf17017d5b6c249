"""Where a result came from: one block that every result file the bench writes carries.

`provenance(command, model)` gathers, at the moment a run starts: the date, the SwarmKV commit
(and whether the tree had uncommitted changes), llama.cpp's commit and the patch series, the
CPU (model, family/model numbers, flags, cores), the ggml CPU features and library loaded,
the build (native or portable, CUDA, AMX, variants), the kernel switches set in the
environment, the model file and its sha256, and the exact command line. Results pages quote
figures from files that carry it, and tests/unit/test_results_docs.py checks each page
against its file.

The SwarmKV commit: an editable install imports swarmkv from the checkout itself; a plain
`pip install .` copies it into site-packages, so the checkout is looked for where the bench
was started too. Uncommitted changes are said, never hidden.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import swarmkv

SCHEMA = "swarmkv-provenance/1"
# Environment variables that change what the build's tools or the threads do. (The kernels
# read no environment: their switches are per context, recorded by the results that set them.)
SWITCHES = (
    "LLAMA_BATCH_INVARIANT", "OMP_NUM_THREADS", "OMP_PROC_BIND", "GOMP_SPINCOUNT",
    "SWARMKV_MODEL", "SWARMKV_LLAMA_SERVER",
)  # fmt: skip


def _git(repo: Path, *args: str) -> str | None:
    """git's stdout in repo, stripped; None when git is missing or the command fails."""
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _swarmkv_checkout(start: Path) -> Path | None:
    """The top of the git work tree holding start, if that tree is SwarmKV's source."""
    top = _git(start, "rev-parse", "--show-toplevel")
    if top is None or not (Path(top) / "src" / "swarmkv" / "__init__.py").is_file():
        return None
    return Path(top)


def swarmkv_commit(starts: Sequence[Path] | None = None) -> str:
    """`<commit>` of the first SwarmKV checkout found from starts (default: the imported
    package's folder, then the working directory), with "(+ uncommitted changes)" when
    tracked files differ from it and "checkout at <path>; the package ran from an installed
    copy" when only a later start found it; otherwise the installed version and why no
    commit."""
    package_dir = Path(swarmkv.__file__).resolve().parent
    starts = [package_dir, Path.cwd()] if starts is None else list(starts)
    for i, start in enumerate(starts):
        top = _swarmkv_checkout(start)
        commit = _git(top, "rev-parse", "HEAD") if top is not None else None
        if top is None or commit is None:
            continue
        notes = []
        if _git(top, "status", "--porcelain", "--untracked-files=no"):
            notes.append("+ uncommitted changes")
        if i > 0:
            notes.append(f"checkout at {top}; the package ran from an installed copy")
        return commit + (f" ({'; '.join(notes)})" if notes else "")
    return f"none found (swarmkv {swarmkv.__version__} installed, no git checkout beside it)"


def cpu_identity() -> dict[str, Any]:
    """The CPU as /proc/cpuinfo names it: model name, vendor, family/model/stepping numbers
    (a VM may show only "AMD EPYC": the numbers still tell Zen 3 from Zen 4), every flag."""
    from swarmkv.llama.install_info import cpuinfo_fields

    fields = cpuinfo_fields()
    return {
        "model_name": fields.get("model name", platform.processor() or platform.machine()),
        "vendor": fields.get("vendor_id"),
        "family": fields.get("cpu family"),
        "model": fields.get("model"),
        "stepping": fields.get("stepping"),
        "arch": platform.machine(),
        "logical_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "flags": sorted(fields.get("flags", "").split()),
    }


@lru_cache(maxsize=8)
def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def model_facts(model: str | Path | None) -> dict[str, Any] | None:
    """The model file a run used: name, path, bytes, sha256 (None when the run had none)."""
    if model is None:
        return None
    path = Path(model)
    return {
        "name": path.name,
        "path": str(path),
        "bytes": path.stat().st_size,
        "sha256": file_sha256(str(path.resolve())),
    }


def provenance(command: str, model: str | Path | None = None) -> dict[str, Any]:
    """The provenance block of a result file (see the module docstring)."""
    from swarmkv import info

    facts = info()
    build = dict(facts["build"])
    build["backend_libraries"] = facts["backend_libraries"]
    return {
        "schema": SCHEMA,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": command,
        "swarmkv_version": facts["swarmkv_version"],
        "swarmkv_commit": swarmkv_commit(),
        "llama_cpp_commit": facts["llama_cpp_commit"],
        "patches": facts["patches"],
        "cpu": cpu_identity(),
        "ggml_cpu_features": sorted(facts["ggml_cpu_features"]),
        "ggml_cpu_library": facts["ggml_cpu_library"],
        "build": build,
        "switches": {k: os.environ[k] for k in SWITCHES if k in os.environ},
        "model": model_facts(model),
        "python": platform.python_version(),
    }


def patch_numbers(patches: Iterable[str]) -> str:
    """Patches (file names, with or without `:hash`) as a report writes them: "0001, 0002"."""
    return ", ".join(p.split("-", 1)[0] for p in patches)


def summary_lines(block: dict[str, Any]) -> list[str]:
    """The block as the lines a report or results page shows (Markdown list items)."""
    cpu = block["cpu"]
    build = block["build"]
    model = block["model"]
    flags = [f for f in cpu["flags"] if f.startswith(("avx", "amx", "fma", "f16c"))]
    lines = [
        f"- date: {block['date']}",
        f"- command: `{block['command']}`",
        f"- swarmkv commit: {block['swarmkv_commit']}",
        f"- llama.cpp commit: {block['llama_cpp_commit']}, patches: "
        + patch_numbers(block["patches"]),
        f"- CPU: {cpu['model_name']} (family {cpu['family']}, model {cpu['model']}), "
        f"{cpu['logical_cores']} logical cores; flags: {' '.join(flags)}",
        f"- ggml CPU features: {' '.join(block['ggml_cpu_features'])}",
        f"- build: CPU {build['cpu_mode']}, CUDA {'on' if build['cuda'] else 'off'}, AMX "
        f"{'opt-in' if build['amx_opt_in'] else 'off'}; loaded {block['ggml_cpu_library']}",
        "- switches: "
        + (", ".join(f"{k}={v}" for k, v in block["switches"].items()) or "none set"),
    ]
    if model is not None:
        lines.append(f"- model: {model['name']} ({model['bytes']} bytes, sha256 {model['sha256']})")
    return lines


def script_command() -> str:
    """How a script was started: `python bench/NAME.py ARGS` as typed."""
    return shlex.join(["python", *sys.argv])


def write_result(path: Path, result: dict[str, Any], model: str | Path | None) -> Path:
    """Write a bench/ script's result as JSON, its provenance block first."""
    doc = {"provenance": provenance(script_command(), model), **result}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, allow_nan=False, default=str) + "\n")
    return path
