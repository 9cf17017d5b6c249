"""The `swarmkv` command: run a pipeline from flags or a TOML file, or the built-in demo.

    swarmkv run --doc report.txt --branch "Summary:" --branch "Risks:" [--mode fork] [--json]
    swarmkv run pipeline.toml [--mode host] [-n 32]
    swarmkv demo [--json]
    swarmkv info [--json]

This module only parses arguments, builds specs and prints; the work is the library's.
Modules that do native work are imported inside the command functions, so building the
parser or loading a TOML spec never touches llama.cpp.

Exit codes: 0 success; 1 a pipeline node failed (the other results are still printed);
2 a usage or configuration error (`swarmkv: error: ...`); 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import textwrap
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import __version__
from .bench.command import add_parser as add_bench_parser
from .errors import SwarmKVError
from .info_command import add_parser as add_info_parser
from .interrupt import Interrupted, run_interruptibly
from .modes import MODES
from .pipeline_toml import (
    BranchSpec,
    DocumentSpec,
    PipelineSpec,
    Settings,
    build_pipeline,
    load_pipeline_spec,
)

if TYPE_CHECKING:
    from tqdm import tqdm

    from .llama import Model
    from .pipeline import Pipeline
    from .results import PipelineResult

PROG = "swarmkv"


# -- arguments ------------------------------------------------------------------------------
def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-m",
        "--model",
        metavar="PATH",
        help="GGUF model file (default: Gemma 3 270M, or $SWARMKV_MODEL)",
    )
    parser.add_argument(
        "-t",
        "--threads",
        type=_positive_int,
        metavar="N",
        help="CPU threads per context (default: every usable CPU)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log progress and llama.cpp's messages; tracebacks on errors",
    )


def _add_run(subs: Any) -> None:
    run = subs.add_parser(
        "run",
        allow_abbrev=False,
        help="prefill a document once and answer several branches",
        description="Prefill a document once and fan its KV state out to branches. Give "
        "either --doc and --branch flags or a PIPELINE.toml file; flags override the file's "
        "[settings].",
    )
    run.add_argument(
        "pipeline",
        nargs="?",
        metavar="PIPELINE.toml",
        help="a pipeline file (see swarmkv.pipeline_toml for the schema)",
    )
    run.add_argument("--doc", metavar="FILE", help="the shared document (UTF-8 text)")
    run.add_argument(
        "--branch",
        action="append",
        metavar="TEXT",
        help="a prompt appended to the document (\\n, \\t and \\\\ are read as newline, "
        "tab and backslash); repeat for more branches (named b1, b2, ...)",
    )
    run.add_argument(
        "--mode", choices=MODES, help="how branches get the document's KV state (default: fork)"
    )
    run.add_argument(
        "-n",
        "--n-predict",
        type=_positive_int,
        metavar="N",
        help="tokens to generate per branch (default: 64)",
    )
    run.add_argument(
        "-c",
        "--ctx-size",
        type=_positive_int,
        metavar="N",
        help="context size (default: sized from the document and branches)",
    )
    run.add_argument("--seed", type=int, metavar="N", help="sampler seed (default: 0)")
    run.add_argument(
        "--temp", type=float, metavar="F", help="sampling temperature; 0 is greedy (default: 0)"
    )
    _common(run)
    run.set_defaults(func=_cmd_run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        allow_abbrev=False,
        description="Prefill a shared document once, fan its KV state out to many LLM branches.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    subs = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_run(subs)
    demo = subs.add_parser(
        "demo",
        allow_abbrev=False,  # else `demo --mode` would silently mean --model
        help="a built-in two-question example, fork mode against baseline",
        description="Answer two questions about a built-in report in fork mode and in "
        "baseline mode, and print the speedup.",
    )
    _common(demo)
    demo.set_defaults(func=_cmd_demo)
    add_bench_parser(subs)
    add_info_parser(subs)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parsed arguments; bad combinations exit with status 2, as argparse's own errors do."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "run":
        if args.pipeline is not None and (args.doc is not None or args.branch):
            parser.error("run: give either PIPELINE.toml or --doc/--branch, not both")
        if args.pipeline is None and (args.doc is None or not args.branch):
            parser.error(
                "run: give --doc FILE and at least one --branch TEXT, or a PIPELINE.toml file"
            )
    return args


# -- from arguments to a spec ---------------------------------------------------------------
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def unescape(text: str) -> str:
    """Read \\n, \\t and \\\\ in a --branch prompt, as llama.cpp's CLI does: prompts start
    with newlines (see README, "Writing prompts"), which a shell argument cannot easily hold.
    Any other backslash stays as it is."""
    return re.sub(r"\\([nt\\])", lambda m: _ESCAPES[m.group(1)], text)


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The flags the user gave; None where not given, so a TOML file's values stay."""
    return Settings(
        mode=args.mode,
        model=Path(args.model).expanduser() if args.model else None,
        ctx_size=args.ctx_size,
        threads=args.threads,
        n_predict=args.n_predict,
        temperature=args.temp,
        seed=args.seed,
    )


def spec_from_args(args: argparse.Namespace) -> PipelineSpec:
    """The pipeline the run flags describe: a TOML file, or --doc with branches b1, b2, ..."""
    if args.pipeline is not None:
        spec = load_pipeline_spec(args.pipeline)
    else:
        branches = tuple(
            BranchSpec(f"b{i}", unescape(prompt)) for i, prompt in enumerate(args.branch, 1)
        )
        spec = PipelineSpec(DocumentSpec(path=Path(args.doc).expanduser()), branches)
    return spec.with_settings(settings_from_args(args))


# -- running --------------------------------------------------------------------------------
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
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def run_with_progress(pipe: Pipeline, mode: str, keep_logits: bool | str = False) -> PipelineResult:
    """Run every node; failures are reported by the caller, not raised, to keep the rest."""
    bar = PrefillBar(sys.stderr.isatty())
    try:
        return pipe.run(mode, raise_on_failure=False, progress=bar, keep_logits=keep_logits)
    finally:
        bar.close()


def _report_failures(result: PipelineResult) -> int:
    bad = [o for o in result.outcomes.values() if o.status != "ok"]
    for o in bad:
        sys.stderr.write(f"{PROG}: node {o.name!r} {o.status}: {o.reason or ''}\n")
    return 1 if bad else 0


def _cmd_run(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)  # fully validated before build_pipeline loads the model
    with build_pipeline(spec) as pipe:
        result = run_with_progress(pipe, spec.mode)
    if args.json:
        _write_json({**result.to_dict(), "ok": result.ok})
    else:
        sys.stdout.write(format_result(result))
    return _report_failures(result)


# -- human output ---------------------------------------------------------------------------
def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _answer_block(name: str, prompt: str, text: str) -> str:
    answer = textwrap.indent(text.strip() or "(empty)", "            ").lstrip()
    return f"{name}\n  prompt:   {prompt!r}\n  answer:   {answer}\n"


def format_timings(result: PipelineResult) -> str:
    """A compact table: pipeline totals, then one row per branch (milliseconds)."""
    head = (
        f"prefill_ms {_num(result.prefill_ms)}   e2e_ms {_num(result.e2e_ms)}   "
        f"snapshot_bytes {result.snapshot_bytes}\n"
    )
    width = max([6, *(len(n) for n in result.branches)])
    cols = f"{'branch':<{width}}  tokens  stop    activation_ms  restore_ms  decode_ms\n"
    rows = [
        f"{b.name:<{width}}  {len(b.tokens):>6}  {b.stop_reason:<6}  "
        f"{_num(b.activation_ms):>13}  {_num(b.restore_ms):>10}  {_num(b.decode_ms):>9}\n"
        for b in result.branches.values()
    ]
    return head + cols + "".join(rows)


def format_result(result: PipelineResult) -> str:
    title = (
        f"mode {result.mode}   model {result.model}   {result.prefix_tokens} document "
        f"tokens   n_ctx {result.n_ctx}\n\n"
    )
    answers = "".join(_answer_block(b.name, b.prompt, b.text) for b in result.branches.values())
    return title + answers + "\n" + format_timings(result)


def _write_json(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


# -- demo -----------------------------------------------------------------------------------
def _demo_run(model: Model, mode: str, threads: int | None) -> PipelineResult:
    from .demo_doc import DEMO_DOCUMENT, DEMO_N_PREDICT, DEMO_QUESTIONS, DEMO_STOP, demo_prompt
    from .pipeline import Pipeline

    with Pipeline(model, n_threads=threads) as pipe:
        pipe.prefill("report", text=DEMO_DOCUMENT)
        for name, question in DEMO_QUESTIONS:
            pipe.branch(
                name, prompt=demo_prompt(question), n_predict=DEMO_N_PREDICT, stop=DEMO_STOP
            )
        # every step's logits (2 branches x 48 x 1 MiB): a divergence is judged, not guessed
        return run_with_progress(pipe, mode, keep_logits="all")


def demo_summary(fork: PipelineResult, baseline: PipelineResult) -> dict[str, Any]:
    """The demo's verdict: speedup of fork over baseline and per-branch token identity."""
    from .fidelity import compare

    shared = [n for n in fork.branches if n in baseline.branches]
    fids = {
        n: compare(fork[n].tokens, baseline[n].tokens, fork[n].step_logits, baseline[n].step_logits)
        for n in shared
    }
    speedup = baseline.e2e_ms / fork.e2e_ms if fork.e2e_ms > 0 else float("nan")
    return {
        "speedup": round(speedup, 3),
        "identical": {n: f.tokens_equal for n, f in fids.items()},
        "fidelity": {n: f.describe() for n, f in fids.items()},
        "fidelity_ok": all(f.ok for f in fids.values()),
    }


def format_demo(fork: PipelineResult, baseline: PipelineResult, summary: dict[str, Any]) -> str:
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
        out.append(f"{result.mode:<10}{_num(result.prefill_ms):>12}{_num(result.e2e_ms):>12}\n")
    out.append(f"\nspeedup (baseline e2e / fork e2e): {summary['speedup']:.2f}x\n")
    out.append(
        "fidelity of fork against the baseline (token ids; a divergence passes only at a "
        "near-tie, where the top-2 logit gap is below the batching noise):\n"
    )
    out.extend(f"  {n}: {text}\n" for n, text in summary["fidelity"].items())
    return "".join(out)


def _cmd_demo(args: argparse.Namespace) -> int:
    from .llama import Model
    from .models import default_model_path

    with Model(Path(args.model).expanduser() if args.model else default_model_path()) as model:
        # fork first: whatever a cold start costs (page faults on the weights) counts
        # against SwarmKV, not against the baseline it is compared with
        fork = _demo_run(model, "fork", args.threads)
        baseline = _demo_run(model, "baseline", args.threads)
    summary = demo_summary(fork, baseline)
    if args.json:
        _write_json(
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
    return max(_report_failures(fork), _report_failures(baseline))


# -- entry point ----------------------------------------------------------------------------
def configure_logging(verbose: bool) -> None:
    logging.basicConfig(format="%(name)s: %(levelname)s: %(message)s", stream=sys.stderr)
    logging.getLogger("swarmkv").setLevel(logging.INFO if verbose else logging.WARNING)
    # llama.cpp warns at every model load about things a user cannot act on; its errors
    # still show. With -v it inherits INFO from "swarmkv".
    logging.getLogger("swarmkv.llama").setLevel(logging.NOTSET if verbose else logging.ERROR)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    verbose = bool(getattr(args, "verbose", False))  # `bench` has no -v
    configure_logging(verbose)
    # The work runs in a worker thread so that Ctrl-C lands in the main thread (see
    # swarmkv.interrupt): it stops the work at its next decode boundary, then exits 130.
    code, interrupted = run_interruptibly(lambda: _dispatch(args, verbose))
    if interrupted:
        sys.stderr.write(f"{PROG}: interrupted\n")
        return 130
    return int(code or 0)


def _dispatch(args: argparse.Namespace, verbose: bool) -> int:
    try:
        return int(args.func(args))
    except Interrupted:
        raise
    except SwarmKVError as exc:
        if verbose:
            traceback.print_exc(file=sys.stderr)
        sys.stderr.write(f"{PROG}: error: {exc}\n")
        return 2
