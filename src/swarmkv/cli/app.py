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
import logging
import re
import sys
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from .._version import __version__
from ..engine.options import read_stdin_document
from ..errors import SwarmKVError, SwarmKVWarning
from ..llama.constraint import Constraint
from ..pipeline.modes import MODES
from ..pipeline.toml import (
    BranchSpec,
    DocumentSpec,
    PipelineFile,
    Settings,
    build_pipeline,
    load_pipeline_spec,
)
from ..pipeline.toml_constraint import constraint_from_file
from ..process.interrupt import Interrupted, ctrl_c_sets_flag
from .demo import cmd_demo
from .info import add_parser as add_info_parser
from .output import (
    PrefillBar,
    format_result,
    report_failures,
    write_json,
)
from .serve import add_parser as add_serve_parser
from .snapshot import add_parser as add_snapshot_parser

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
        help="a pipeline file (see swarmkv.pipeline.toml for the schema)",
    )
    run.add_argument(
        "--doc", metavar="FILE", help="the shared document (UTF-8 text; - reads standard input)"
    )
    run.add_argument(
        "--snapshot",
        metavar="FILE.swkv",
        help="start from a snapshot (`swarmkv snapshot create`): alone, the document is the "
        "snapshot's; with --doc, a document that starts with the snapshot's tokens reuses "
        "them and prefills only the rest",
    )
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
    run.add_argument(
        "--ray",
        nargs="?",
        const="local",
        metavar="ADDRESS",
        help="run the branches on Ray workers (pip install '.[dist]'): alone, a local Ray "
        "instance on this machine; with ADDRESS (auto, ray://host:10001), that cluster. The "
        "document is prefilled here once and sent to the workers through Ray's object store",
    )
    run.add_argument(
        "--workers",
        type=_positive_int,
        metavar="N",
        help="Ray workers, each loading the model once (default: 2; needs --ray)",
    )
    run.add_argument(
        "--exact",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="batch-invariant decoding, the default wherever every backend has it (the "
        "CPU's): every branch's tokens and logits are bit-identical to a context of its own; "
        "--no-exact uses llama.cpp's fastest kernels (docs/results/exactness-cost.md "
        "measures both); --exact insists (a GPU context refuses it)",
    )
    _add_constraint_flags(run)
    _common(run)
    run.set_defaults(func=_cmd_run)


def _add_constraint_flags(run: argparse.ArgumentParser) -> None:
    group = run.add_argument_group(
        "structured output",
        "one constraint on every branch's output (a branch of a PIPELINE.toml that sets its "
        "own keeps it)",
    ).add_mutually_exclusive_group()
    group.add_argument(
        "--json-schema", metavar="FILE", help="JSON valid under the JSON schema in FILE"
    )
    group.add_argument("--json-object", action="store_true", help="one JSON object, any keys")
    group.add_argument("--regex", metavar="RE", help="text the regular expression matches whole")
    group.add_argument(
        "--choice",
        action="append",
        metavar="TEXT",
        help="one of these strings; repeat for each (--choice yes --choice no)",
    )
    group.add_argument(
        "--grammar", metavar="FILE", help="a grammar in llguidance's Lark-like syntax, in FILE"
    )
    group.add_argument("--gbnf", metavar="FILE", help="a GBNF grammar (llama.cpp's format) in FILE")


def build_parser() -> argparse.ArgumentParser:
    """The `swarmkv` argument parser with its run, demo, bench and info subcommands."""
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
        "baseline mode, both batch-invariant (as `swarmkv run --exact`), and print the "
        "speedup and the bit-for-bit comparison.",
    )
    _common(demo)
    demo.set_defaults(func=cmd_demo)
    add_snapshot_parser(subs, _common)
    _add_bench(subs)
    add_info_parser(subs)
    add_serve_parser(subs)
    return parser


def _add_bench(subs: Any) -> None:
    """`swarmkv bench`: the benchmark application (bench/swarmkv_bench, installed beside
    swarmkv by the same wheel); a clear error if an install left it out."""
    try:
        from swarmkv_bench.command import add_parser
    except ImportError as exc:
        reason = str(exc)
        bench = subs.add_parser("bench", help="the benchmark (not installed)")
        bench.set_defaults(func=lambda args: _bench_missing(reason))
        return
    add_parser(subs)


def _bench_missing(reason: str) -> int:
    raise SwarmKVError(f"the benchmark application swarmkv_bench is not installed ({reason})")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parsed arguments; bad combinations exit with status 2, as argparse's own errors do."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "run":
        if args.pipeline is not None and (args.doc is not None or args.branch):
            parser.error("run: give either PIPELINE.toml or --doc/--branch, not both")
        no_doc = args.doc is None and args.snapshot is None
        if args.pipeline is None and (no_doc or not args.branch):
            parser.error(
                "run: give --doc FILE (or --snapshot FILE.swkv) and at least one --branch "
                "TEXT, or a PIPELINE.toml file"
            )
        if args.workers is not None and args.ray is None:
            parser.error("run: --workers needs --ray")
    return args


# -- from arguments to a spec ---------------------------------------------------------------
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def unescape(text: str) -> str:
    """Read \\n, \\t and \\\\ in a --branch prompt, as llama.cpp's CLI does: prompts start
    with newlines (docs/guide/prompts.md), which a shell argument cannot easily hold.
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
        exact=args.exact,
        constraint=constraint_from_args(args),
    )


def constraint_from_args(args: argparse.Namespace) -> Constraint | None:
    """The structured-output flag given (argparse allows one), validated; None without."""
    for flag, key in (("json_schema", "json_schema_file"), ("grammar", "grammar_file"),
                      ("gbnf", "gbnf_file")):  # fmt: skip
        path = getattr(args, flag, None)
        if path is not None:
            return constraint_from_file(key, Path(path).expanduser(), "--" + flag.replace("_", "-"))
    constraint = None
    if getattr(args, "json_object", False):
        constraint = Constraint.json_object()
    elif getattr(args, "regex", None) is not None:
        constraint = Constraint.regex(args.regex)
    elif getattr(args, "choice", None):
        constraint = Constraint.choice(args.choice)
    if constraint is not None:
        constraint.validate()
    return constraint


def spec_from_args(args: argparse.Namespace) -> PipelineFile:
    """The pipeline the run flags describe: a TOML file, or --doc with branches b1, b2, ..."""
    if args.pipeline is not None:
        spec = load_pipeline_spec(args.pipeline)
    else:
        branches = tuple(
            BranchSpec(f"b{i}", unescape(prompt)) for i, prompt in enumerate(args.branch, 1)
        )
        spec = PipelineFile(_document(args.doc), branches)
    if args.snapshot is not None:  # the flag wins over the file's [document] snapshot
        snapshot = Path(args.snapshot).expanduser()
        spec = replace(spec, document=replace(spec.document, snapshot=snapshot))
    return spec.with_settings(settings_from_args(args))


def _document(arg: str | None) -> DocumentSpec:
    """--doc FILE, or `-` for standard input; None when only --snapshot is given."""
    if arg == "-":
        return DocumentSpec(text=read_stdin_document("doc"))
    return DocumentSpec(path=Path(arg).expanduser() if arg is not None else None)


def _cmd_run(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)  # fully validated before build_pipeline loads the model
    # failures are reported below, not raised, so the branches that worked still print
    with build_pipeline(spec) as pipe, PrefillBar(sys.stderr.isatty()) as bar:
        if args.ray is not None:
            from ..dist import run_on_ray

            address = None if args.ray == "local" else args.ray
            result = run_on_ray(
                pipe,
                spec.mode,
                workers=args.workers or 2,
                address=address,
                threads=args.threads,
                raise_on_failure=False,
                progress=bar,
            )
        else:
            result = pipe.run(spec.mode, raise_on_failure=False, progress=bar)
    if args.json:
        write_json({**result.to_dict(), "ok": result.ok})
    else:
        sys.stdout.write(format_result(result))
    return report_failures(result)


# -- entry point ----------------------------------------------------------------------------
def configure_logging(verbose: bool) -> None:
    """Log to stderr: swarmkv at INFO when verbose, else WARNING with llama.cpp errors only."""
    logging.basicConfig(format="%(name)s: %(levelname)s: %(message)s", stream=sys.stderr)
    logging.getLogger("swarmkv").setLevel(logging.INFO if verbose else logging.WARNING)
    # llama.cpp warns at every model load about things a user cannot act on; its errors
    # still show. With -v it inherits INFO from "swarmkv".
    logging.getLogger("swarmkv.llama").setLevel(logging.NOTSET if verbose else logging.ERROR)


def _one_line_warnings(show: Callable[..., None]) -> Callable[..., None]:
    """A warnings.showwarning that prints a SwarmKVWarning as one line,
    `swarmkv: warning: ...`, and leaves every other warning to show."""

    def showwarning(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        if issubclass(category, SwarmKVWarning):
            (file or sys.stderr).write(f"{PROG}: warning: {message}\n")
        else:
            show(message, category, filename, lineno, file, line)

    return showwarning


def main(argv: Sequence[str] | None = None) -> int:
    """The `swarmkv` entry point; returns the exit status.

    The command's own status, 2 after a SwarmKVError, 130 when interrupted (Ctrl-C).
    """
    args = parse_args(argv)
    verbose = bool(getattr(args, "verbose", False))  # `bench` has no -v
    configure_logging(verbose)
    # Ctrl-C only sets a flag (see swarmkv.process.interrupt): the work stops at its next decode
    # boundary and unwinds, freeing every handle, then the command exits 130.
    code = 0
    with warnings.catch_warnings(), ctrl_c_sets_flag() as ctrl_c:
        warnings.showwarning = _one_line_warnings(warnings.showwarning)
        try:
            code = int(args.func(args) or 0)
        except Interrupted:
            pass
        except SwarmKVError as exc:
            if verbose:
                traceback.print_exc(file=sys.stderr)
            sys.stderr.write(f"{PROG}: error: {exc}\n")
            code = 2
    if ctrl_c.interrupted:
        sys.stderr.write(f"{PROG}: interrupted\n")
        return 130
    return code
