"""Peak RSS of one mode measured on its own (measuring.md): a fresh process loads the model
the mode uses, runs the mode once with no logits kept and reports its high-water mark
(VmHWM), so neither another mode's leftovers nor logits kept for fidelity count.

The benchmark runs one probe per mode and config after the timed trials;
`python -m swarmkv_bench.memprobe` reads the request as JSON on stdin and prints one JSON line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from swarmkv.errors import SwarmKVError

from .sysinfo import proc_status_bytes
from .workload import BenchConfig

PROBE_TIMEOUT_S = 3 * 3600  # a 64-branch baseline runs about 9 minutes on two cores


def measure(
    request: dict[str, Any], cfg: BenchConfig, doc: str, prompts: list[str]
) -> dict[str, int | None]:
    """Run the mode named in request["mode"] in a fresh process; returns its peak_rss_bytes,
    model_rss_bytes (after loading the model) and kv_bytes. SwarmKVError when it fails."""
    body = request | {"config": asdict(cfg), "doc": doc, "prompts": prompts}
    cmd = [sys.executable, "-m", "swarmkv_bench.memprobe"]
    try:
        proc = subprocess.run(
            cmd,
            input=json.dumps(body),
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:  # a failed probe, not a failed benchmark
        raise SwarmKVError(
            f"memory probe of {request['mode']} ran past {PROBE_TIMEOUT_S} s"
        ) from exc
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise SwarmKVError(f"memory probe of {request['mode']} exited {proc.returncode}: {tail}")
    out: dict[str, int | None] = json.loads(lines[-1])
    return out


def _probe(body: dict[str, Any]) -> dict[str, int | None]:
    from swarmkv.llama.model import Model

    from .modes import parse_mode
    from .runner import BenchOptions, pipeline_for

    spec = parse_mode(body["mode"])
    cfg = BenchConfig(**body["config"])
    opts = BenchOptions(
        model_path=Path(body["model"]),
        configs=(cfg,),
        threads=body["threads"],
        n_batch=body["n_batch"],
        n_ctx=body["n_ctx"],
    )
    # as the runner: llama.cpp's repacked weights, except for batch-invariant modes
    with Model(opts.model_path, repack=not spec.batch_invariant) as model:
        loaded = proc_status_bytes("VmRSS")
        with pipeline_for(opts, model, spec, body["doc"], body["prompts"], cfg) as pipe:
            res = pipe.run(mode=spec.mode)
    return {
        "peak_rss_bytes": proc_status_bytes("VmHWM"),
        "model_rss_bytes": loaded,
        "kv_bytes": res.kv_bytes,
    }


def main() -> int:
    """Read the request from stdin, run it, print the result as one JSON line."""
    print(json.dumps(_probe(json.load(sys.stdin))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
