"""`swarmkv info`: what this install is, what it was built for, and what it runs on.

Parsing and printing only; the facts come from swarmkv.llama.install_info (imported when
the command runs, so building the parser never starts llama.cpp).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_parser(subs: Any) -> None:
    """Register `swarmkv info [--json]` on the CLI's subparsers."""
    info = subs.add_parser(
        "info",
        allow_abbrev=False,
        help="version, llama.cpp commit and patches, build, CPU features, devices, model",
        description="Print what this SwarmKV install was built with and what it runs on.",
    )
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.set_defaults(func=run)


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:.1f} MiB"


def format_info(facts: dict[str, Any]) -> str:
    """The human-readable form of swarmkv.info()."""
    build, cpu, model = facts["build"], facts["machine_cpu"], facts["default_model"]
    ggml_feats = [k if v == "1" else f"{k}={v}" for k, v in facts["ggml_cpu_features"].items()]
    lines = [
        f"swarmkv          {facts['swarmkv_version']}",
        f"llama.cpp        {facts['llama_cpp_commit']}",
        f"patches          {', '.join(facts['patches']) or 'none'}",
        f"build            CPU {build['cpu_mode']}; CUDA {'yes' if build['cuda'] else 'no'} "
        f"({build['cuda_reason']}); AMX opt-in {'yes' if build['amx_opt_in'] else 'no'}",
        f"libraries        {', '.join(facts['backend_libraries'])}",
        f"machine CPU      {cpu['name']} ({cpu['arch']}, {cpu['logical_cores']} logical cores)",
        f"machine flags    {' '.join(cpu['flags']) or 'none of interest'}",
        f"ggml CPU library {facts['ggml_cpu_library'] or 'unknown'}",
        f"ggml CPU kernels {' '.join(ggml_feats)}",
        f"AMX kernels      {'compiled in' if facts['amx_kernels'] else 'not compiled in'}",
        f"backends         {', '.join(facts['backends'])}",
    ]
    for dev in facts["devices"]:
        lines.append(
            f"device           {dev['name']} [{dev['type']}, {dev['backend']}] "
            f"{dev['description']}; memory {_mib(dev['memory_total_bytes'])} total, "
            f"{_mib(dev['memory_free_bytes'])} free"
        )
    pool = facts["host_pool"]
    lines.append(
        f"host pool        {pool['buffer_type']} ({'pinned' if pool['pinned'] else 'not pinned'})"
    )
    if model["path"] is None:  # no size to show: say why instead (missing, a directory)
        lines.append(f"default model    unavailable: {model.get('error')}")
    else:
        lines.append(f"default model    {model['path']} ({_mib(model['bytes'])})")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    """Run `swarmkv info`: print the install facts as text, or as one JSON object with --json."""
    from ..llama.install_info import info

    facts = info()
    sys.stdout.write(json.dumps(facts, indent=2) + "\n" if args.json else format_info(facts))
    return 0
