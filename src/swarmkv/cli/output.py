"""What the CLI prints: a progress bar for the prefill, results as text or JSON.

Shared by `swarmkv run` (app.py) and `swarmkv demo` (demo.py).
"""

from __future__ import annotations

import json
import sys
import textwrap
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tqdm import tqdm

    from ..pipeline.results import PipelineResult

PROG = "swarmkv"


class PrefillBar:
    """A tqdm bar on stderr, fed by Pipeline.run(progress=...).

    Created on the first report, so a mode that reports no shared prefill (baseline) draws
    nothing; disabled unless stderr is a terminal, so pipes and logs stay clean.
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._bar: tqdm[Any] | None = None

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(
                total=total,
                desc="prefill",
                unit="tok",
                file=sys.stderr,
                leave=False,
                dynamic_ncols=True,
            )
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        """Close the bar if one was drawn; safe to call again."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> PrefillBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def report_failures(result: PipelineResult) -> int:
    """Write one stderr line per node that did not end ok; returns the exit code, 1 or 0."""
    bad = [o for o in result.outcomes.values() if o.status != "ok"]
    for o in bad:
        # the library always gives a reason; the fallbacks keep this line from ever ending
        # in nothing (it once did, for errors whose message was empty)
        reason = o.reason or (type(o.error).__name__ if o.error is not None else "no reason given")
        sys.stderr.write(f"{PROG}: node {o.name!r} {o.status}: {reason}\n")
    return 1 if bad else 0


def num(value: float | None) -> str:
    """A number with one decimal, or "-" for None."""
    return "-" if value is None else f"{value:.1f}"


def _answer_block(name: str, prompt: str, text: str) -> str:
    answer = textwrap.indent(text.strip() or "(empty)", "            ").lstrip()
    return f"{name}\n  prompt:   {prompt!r}\n  answer:   {answer}\n"


def format_timings(result: PipelineResult) -> str:
    """A compact table: pipeline totals, then one row per branch (milliseconds)."""
    head = (
        f"prefill_ms {num(result.prefill_ms)}   e2e_ms {num(result.e2e_ms)}   "
        f"snapshot_bytes {result.snapshot_bytes}\n"
    )
    width = max([6, *(len(n) for n in result.branches)])
    cols = f"{'branch':<{width}}  tokens  stop    activation_ms  restore_ms  decode_ms\n"
    rows = [
        f"{b.name:<{width}}  {len(b.tokens):>6}  {b.stop_reason:<6}  "
        f"{num(b.activation_ms):>13}  {num(b.restore_ms):>10}  {num(b.decode_ms):>9}\n"
        for b in result.branches.values()
    ]
    return head + cols + "".join(rows)


def format_result(result: PipelineResult) -> str:
    """The text output of a run: mode, model and sizes, each branch's answer, then timings."""
    title = (
        f"mode {result.mode}   model {result.model}   {result.prefix_tokens} document "
        f"tokens   n_ctx {result.n_ctx}\n"
    )
    if result.reused_tokens:
        title += f"reused {result.reused_tokens} of them from the snapshot\n"
    title += "\n"
    answers = "".join(_answer_block(b.name, b.prompt, b.text) for b in result.branches.values())
    return title + answers + "\n" + format_timings(result) + format_dist(result.dist)


def format_dist(dist: dict[str, Any] | None) -> str:
    """Where a Ray run's time went: the driver's prefill and put, then each worker's."""
    if dist is None:
        return ""
    made = "prefill + capture" if dist["driver_prefilled"] else "snapshot opened"
    lines = [
        f"ray: driver {made} {dist['driver_prefill_ms']:.1f} ms, object store put "
        f"{dist['put_ms']:.1f} ms ({dist['snapshot_bytes']} bytes, once)\n"
    ]
    for w in dist["workers"]:
        lines.append(
            f"  worker {w['worker']} on {w['host']}: {w['branches']} branches, model load "
            f"{w.get('load_ms', float('nan')):.0f} ms (once), get {w['get_ms']:.1f} ms, "
            f"verify {w['verify_ms']:.1f} ms, restore {w['restore_ms']:.1f} ms, "
            f"run {w['run_ms']:.1f} ms\n"
        )
    lines += [f"  worker {w['worker']} LOST: {w['error']}\n" for w in dist["lost_workers"]]
    return "".join(lines)


def write_json(obj: dict[str, Any]) -> None:
    """Print obj to stdout as indented JSON."""
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")
