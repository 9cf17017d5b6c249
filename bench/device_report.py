#!/usr/bin/env python3
"""device_report.md: what bench/device_check.sh's run found, on one page.

    python bench/device_report.py OUT_DIR TESTS_EXIT_STATUS SHAPE > OUT_DIR/device_report.md

Reads OUT_DIR/info.txt (`swarmkv info`), cuda-tests.log (pytest's summary line) and
paper-best_run.json (the paper configuration: provenance, each mode's medians, speedups and
fidelity), and writes the device, the build, the CUDA tests' outcome, and per mode the
end-to-end and second-branch activation speedups over the baseline with the trials' spread.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _summary_line(log: Path) -> str:
    lines = [ln for ln in log.read_text().splitlines() if ln.strip()] if log.exists() else []
    return lines[-1].strip("= ") if lines else "(no output)"


def _info(path: Path, keys: tuple[str, ...]) -> list[str]:
    rows = path.read_text().splitlines() if path.exists() else []
    return [r for r in rows if r.split(" ", 1)[0] in keys]


def _mode_rows(config: dict[str, Any]) -> list[str]:
    rows = []
    for s in config["speedups"]:
        if s["baseline_mode"] != "baseline" or s["mode"] == "baseline":
            continue
        mode = config["modes"][s["mode"]]
        act = s["speedup_activation"]
        rows.append(
            f"| {s['mode']} | {mode['e2e_ms']['median']:.1f} [{mode['e2e_ms']['min']:.1f}-"
            f"{mode['e2e_ms']['max']:.1f}] | {s['speedup_e2e']:.2f}x | "
            f"{act[1] if len(act) > 1 else act[0]:.1f}x | "
            f"{mode['fidelity_ok']} of {mode['fidelity_checked']} |"
        )
    return rows


def report(out: Path, tests_rc: int, shape: str) -> str:
    best = json.loads((out / "paper-best_run.json").read_text())
    prov = best["provenance"]
    lines = [
        "# Device check",
        "",
        f"- date: {prov.get('date')}; swarmkv {prov.get('swarmkv_commit')}; "
        f"llama.cpp {prov.get('llama_cpp_commit')}",
        f"- command: `{prov.get('command')}`",
        f"- model: random weights, shape `{shape}` (bench/device_model.py), "
        f"{best['setup'].get('model')}",
        *(
            f"- {row}"
            for row in _info(out / "info.txt", ("build", "backends", "device", "host", "machine"))
        ),
        f"- CUDA tests (pytest -m cuda, exit {tests_rc}): {_summary_line(out / 'cuda-tests.log')}",
        "",
        "| mode | e2e ms, median [min-max] | speedup e2e | branch 2 activation | fidelity |",
        "|---|--:|--:|--:|--:|",
    ]
    for config in best["configs"].values():
        lines += _mode_rows(config)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(report(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]))
