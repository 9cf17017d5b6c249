"""`swarmkv demo`: two questions about a built-in report, in fork mode and as the baseline.

Prints both answers, the measured speedup and the fidelity verdict; the work is the
library's, this module only runs and prints it.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .output import PrefillBar, num, report_failures, write_json

if TYPE_CHECKING:
    from ..llama.model import Model
    from ..pipeline.results import PipelineResult


def _demo_run(model: Model, mode: str, threads: int | None) -> PipelineResult:
    from ..pipeline.builder import Pipeline
    from .demo_doc import DEMO_DOCUMENT, DEMO_N_PREDICT, DEMO_QUESTIONS, DEMO_STOP, demo_prompt

    with (
        Pipeline(model, n_threads=threads) as pipe,  # batch-invariant where supported
        PrefillBar(sys.stderr.isatty()) as bar,
    ):
        pipe.prefill("report", text=DEMO_DOCUMENT)
        for name, question in DEMO_QUESTIONS:
            pipe.branch(
                name, prompt=demo_prompt(question), n_predict=DEMO_N_PREDICT, stop=DEMO_STOP
            )
        # every step's logits (2 branches x 48 x 1 MiB): a divergence is judged, not guessed
        return pipe.run(mode, raise_on_failure=False, progress=bar, keep_logits="all")


def demo_summary(
    fork: PipelineResult, baseline: PipelineResult, exact: bool = False
) -> dict[str, Any]:
    """The demo's verdict: speedup of fork over baseline and per-branch token identity.

    exact: both ran batch-invariant, so any difference at all is a failure.
    """
    from ..pipeline.fidelity import compare

    shared = [n for n in fork.branches if n in baseline.branches]
    fids = {
        n: compare(
            fork[n].tokens,
            baseline[n].tokens,
            fork[n].step_logits,
            baseline[n].step_logits,
            exact=exact,
        )
        for n in shared
    }
    speedup = baseline.e2e_ms / fork.e2e_ms if fork.e2e_ms > 0 else float("nan")
    return {
        "speedup": round(speedup, 3),
        "identical": {n: f.tokens_equal for n, f in fids.items()},
        "fidelity": {n: f.describe() for n, f in fids.items()},
        "fidelity_ok": all(f.ok for f in fids.values()),
        "exact": bool(exact),
    }


def format_demo(fork: PipelineResult, baseline: PipelineResult, summary: dict[str, Any]) -> str:
    """The demo's text: each mode's answers, prefill and e2e milliseconds, speedup, fidelity."""
    from .demo_doc import DEMO_N_PREDICT, DEMO_QUESTIONS

    out = [
        f"SwarmKV demo: a {fork.prefix_tokens}-token report, {len(DEMO_QUESTIONS)} "
        f"questions, up to {DEMO_N_PREDICT} tokens each (model {fork.model})\n"
    ]
    titles = {
        "fork": "fork: the report is prefilled once; branches share its KV cells",
        "baseline": "baseline: every branch prefills the report itself",
    }
    for result in (fork, baseline):
        out.append(f"\n== {titles[result.mode]}\n")
        for name, question in DEMO_QUESTIONS:
            text = result[name].text.strip() if name in result.branches else "(failed)"
            out.append(f"{name}  {question}\n    -> {textwrap.indent(text, '       ').lstrip()}\n")
    out.append(f"\n{'':<10}{'prefill_ms':>12}{'e2e_ms':>12}\n")
    for result in (fork, baseline):
        out.append(f"{result.mode:<10}{num(result.prefill_ms):>12}{num(result.e2e_ms):>12}\n")
    out.append(f"\nspeedup (baseline e2e / fork e2e): {summary['speedup']:.2f}x\n")
    out.append(
        "fidelity of fork against the baseline (both batch-invariant: every token and every "
        "step's logits must be identical):\n"
    )
    out.extend(f"  {n}: {text}\n" for n, text in summary["fidelity"].items())
    return "".join(out)


def cmd_demo(args: argparse.Namespace) -> int:
    """Run `swarmkv demo`: fork, then baseline, on one loaded model; print text or JSON.

    Returns 1 when a node of either run did not end ok, else 0.
    """
    from ..llama.model import Model
    from ..llama.models import default_model_path

    path = Path(args.model).expanduser() if args.model else default_model_path()
    with Model(path) as model:
        # fork first: whatever a cold start costs (page faults on the weights) counts
        # against SwarmKV, not against the baseline it is compared with
        fork = _demo_run(model, "fork", args.threads)
        baseline = _demo_run(model, "baseline", args.threads)
    # both batch-invariant (exact=None on a CPU): the answers must agree bit for bit, any
    # difference fails; plain kernels (a GPU) are judged with the near-tie rule
    summary = demo_summary(fork, baseline, exact=bool(fork.exact and baseline.exact))
    if args.json:
        write_json(
            {
                "model": fork.model,
                "prefix_tokens": fork.prefix_tokens,
                **summary,
                "fork": fork.to_dict(),
                "baseline": baseline.to_dict(),
                "ok": fork.ok and baseline.ok,
            }
        )
    else:
        sys.stdout.write(format_demo(fork, baseline, summary))
    return max(report_failures(fork), report_failures(baseline))
