"""`swarmkv bench`: argument parsing and the call into the harness (no logic of its own)."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

from swarmkv.checks import check_int, check_number
from swarmkv.engine.options import read_document
from swarmkv.errors import ConfigError
from swarmkv.llama.budget import GGML_MAX_N_THREADS
from swarmkv.llama.config import INT32_MAX, LLAMA_MAX_SEQ

from .modes import PEER_PREFIX, PEERS, peer_setups
from .serve_command import add_serve_options
from .workload import BenchConfig

PAPER_DOC_TOKENS = 3501


# -- option types: every number is checked here, so a bad one exits 2 before any work ------
# argparse names the option: "argument --trials: value must be >= 1, got 0". The checks are
# swarmkv.checks', the one validation of user numbers.
def _refused(exc: ConfigError) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(str(exc))


def count(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in [lo, hi]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        try:
            return check_int("value", value, lo=lo, hi=hi)
        except ConfigError as exc:
            raise _refused(exc) from None

    return parse


def counts(text: str) -> list[int]:
    """An argparse type: a comma list of integers >= 1 (1,2,4,8), one at least."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values:
        raise argparse.ArgumentTypeError(f"not a comma list of integers: {text!r}")
    try:
        return [check_int("value", v, lo=1) for v in values]
    except ConfigError as exc:
        raise _refused(exc) from None


def rates(text: str) -> list[float]:
    """An argparse type: a comma list of finite numbers > 0 (arrivals per second)."""
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values:
        raise argparse.ArgumentTypeError(f"not a comma list of numbers: {text!r}")
    for v in values:
        try:
            check_number("value", v)
        except ConfigError as exc:
            raise _refused(exc) from None
        if v <= 0:
            raise argparse.ArgumentTypeError(f"value must be > 0, got {v:g}")
    return values


def n_range(text: str) -> tuple[int, int]:
    """An argparse type: MIN,MAX, integers with 1 <= MIN <= MAX."""
    values = counts(text)
    if len(values) != 2 or values[0] > values[1]:
        raise argparse.ArgumentTypeError(f"give MIN,MAX with MIN <= MAX, got {text!r}")
    return values[0], values[1]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register `swarmkv bench` and its options on the CLI's subparsers; returns it."""
    p = sub.add_parser("bench", help="benchmark baseline vs SwarmKV modes (and llama-server)")
    p.add_argument(
        "--paper",
        action="store_true",
        help="the paper's setup: 3501-token fox document, 2 branches, n_ctx 4096, "
        "16 generated tokens, 3 trials + warm-up",
    )
    p.add_argument(
        "--branches", type=counts, default="2", help="comma list of branch counts, e.g. 1,2,4,8"
    )
    p.add_argument(
        "--doc-tokens", type=counts, default=str(PAPER_DOC_TOKENS), help="comma list of sizes"
    )
    p.add_argument(
        "--modes",
        default="baseline,host,fork,fork+inv",
        help="comma list: baseline, host, fork (llama.cpp's fastest kernels), variants like "
        "fork+inv (batch-invariant: what `swarmkv run` does by default), fork+exact, "
        "fork+streams, fork+per_branch, fork+fa_off, host+swa_window, device+inv (the prefix "
        "copied on device, ON_DEVICE state), host+inv+shared and fork+inv+shared (start from "
        "a snapshot file made once, mapped shared), and peers "
        "server-np1, server-npN (one unified KV buffer), server-npNslots (a KV cache per "
        "slot) (llama-server with --swa-full, like for like), "
        "server-np1+swa_window, server-npN+swa_window (its default), server-np1+inv, "
        "server-npN+inv (its batch-invariant kernels: judged strictly against baseline+inv); "
        "every peer's reference baseline joins the run",
    )
    p.add_argument("-n", "--n-predict", type=count(1), default=32)
    p.add_argument("--trials", type=count(1), default=3)
    p.add_argument("--warmup", type=count(0), default=1)
    p.add_argument(
        "--reference-trials",
        type=count(1),
        default=None,
        metavar="K",
        help="run the baselines in only the first K measured trials, without warm-up (the "
        "report labels them; later trials are checked against their last result): 32 "
        "independent contexts take minutes per trial",
    )
    p.add_argument("--doc", type=Path, default=None, help="a real text file instead of the fox")
    p.add_argument("-m", "--model", type=Path, default=None)
    p.add_argument("-t", "--threads", type=count(1, GGML_MAX_N_THREADS), default=None)
    p.add_argument("-c", "--ctx-size", type=count(1, INT32_MAX), default=None)
    p.add_argument(
        "--peers",
        nargs="?",
        const="all",
        default=None,
        metavar="SETUPS",
        help="llama-server peers (bench/build_llama_server.sh): all (the value when none is "
        "given), none, or a comma list of np1, npN, npNslots. Without --swarm: add them to "
        "--modes (all: every server mode, +swa_window too). With --swarm: replay the same "
        "arrivals against each (default: all three when llama-server is built)",
    )
    p.add_argument(
        "--no-memory-probe",
        dest="memory_probe",
        action="store_false",
        help="skip the run of each mode in a fresh process that measures its own peak RSS",
    )
    p.add_argument("--out", type=Path, default=Path("results"))
    _add_swarm_options(p)
    add_serve_options(p)
    p.set_defaults(func=run)
    return p


def _add_swarm_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("swarm (--swarm): agents arriving over time")
    g.add_argument(
        "--swarm",
        action="store_true",
        help="Poisson arrivals against the swarm scheduler (each policy), host mode's "
        "global lock and llama-server (--peers); writes swarm.json, swarm.csv, "
        "swarm_report.md and plots",
    )
    g.add_argument(
        "--rates", type=rates, default="2", help="comma list of arrival rates (per second)"
    )
    g.add_argument("--agents", type=count(1), default=50, help="agents per rate (default 50)")
    g.add_argument(
        "--n-range", type=n_range, default="32,32", help="n_predict drawn uniformly: MIN,MAX"
    )
    g.add_argument("--policies", default="fifo,fair,priority", help="swarm policies to run")
    # the swarm keeps one document resident beside the live branches: 256 sequences in all
    g.add_argument(
        "--max-live", type=count(1, LLAMA_MAX_SEQ - 1), default=16, help="live branches at most"
    )
    g.add_argument("--seed", type=count(0), default=0, help="seed of the arrivals")


def run_swarm(args: argparse.Namespace) -> int:
    """`swarmkv bench --swarm`: validate, run every rate, print where the outputs went."""
    from swarmkv.engine.policy import make_policy
    from swarmkv.llama.models import default_model_path

    from .peer_server import find_llama_server
    from .swarm_bench import SwarmBenchOptions, run_swarm_bench
    from .swarm_peers import select_peers
    from .swarm_report import format_value, target_status, targets

    # the numbers were checked by argparse (the option types above)
    n_min, n_max = args.n_range
    policies = tuple(p for p in args.policies.split(",") if p)
    for p in policies:
        make_policy(p)  # ConfigError naming the choices
    peer_bin = find_llama_server()
    peers = select_peers(args.peers, peer_bin)  # ConfigError before the model loads
    opts = SwarmBenchOptions(
        model_path=args.model or default_model_path(),
        rates=tuple(args.rates),
        agents=args.agents,
        n_min=n_min,
        n_max=n_max,
        seed=args.seed,
        policies=policies,
        max_live=args.max_live,
        doc_tokens=args.doc_tokens[0],
        threads=args.threads,
        out_dir=args.out,
        command=shlex.join(["swarmkv", *sys.argv[1:]]),
        peers=peers,
        peer_bin=peer_bin,
    )
    report = run_swarm_bench(opts)
    sys.stdout.write(f"wrote swarm.json, swarm.csv, swarm_report.md and plots to {args.out}\n")
    for entry in report["rates"]:
        for name, value, op, goal in targets(entry):
            status, shown = target_status(value, goal), format_value(value)
            sys.stdout.write(f"  {entry['rate']:g}/s {status:7s} {name}: {shown} {op} {goal}\n")
    return 0


def configs_of(args: argparse.Namespace) -> tuple[BenchConfig, ...]:
    """The configs the arguments ask for: the paper's one, else each doc-tokens x branches pair
    (lists of integers >= 1, as the option types parse them)."""
    if args.paper:
        return (BenchConfig(2, PAPER_DOC_TOKENS, 16),)
    return tuple(BenchConfig(n, d, args.n_predict) for d in args.doc_tokens for n in args.branches)


def require_bench_extra() -> None:
    """ConfigError naming the extra to install when the plotting library is missing, before
    any model is loaded (the benchmark writes plots at the end of a long run)."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise ConfigError(
            "swarmkv bench writes plots with matplotlib, which is not installed: "
            "pip install 'swarmkv[bench]' (or, from a checkout, pip install '.[bench]')"
        )


def run(args: argparse.Namespace) -> int:
    """Run `swarmkv bench`: measure every config and mode, write the outputs, print the targets.

    ConfigError before any model is loaded when matplotlib (the bench extra) is missing, or
    when --doc is not a UTF-8 text file (the message `swarmkv run --doc` gives).
    """
    require_bench_extra()
    if args.overhead_only and not args.serve:
        raise ConfigError("--overhead-only is an option of --serve (the HTTP overhead probe)")
    if args.doc is not None:
        read_document("doc", args.doc)  # found, a file, UTF-8: before the model loads
    if args.swarm:
        return run_swarm(args)
    if args.serve:
        from .serve_command import run_serve

        return run_serve(args)
    from swarmkv.llama.models import default_model_path

    from .output import write_outputs
    from .runner import BenchOptions, run_bench

    modes = tuple(m for m in args.modes.split(",") if m)
    if args.peers == "all":
        modes += PEERS
    elif args.peers is not None:
        modes += tuple(PEER_PREFIX + s for s in peer_setups(args.peers))
    if args.reference_trials is not None and not 1 <= args.reference_trials <= args.trials:
        raise ConfigError(
            f"--reference-trials must be between 1 and --trials ({args.trials}), "
            f"got {args.reference_trials}"
        )
    opts = BenchOptions(
        model_path=args.model or default_model_path(),
        configs=configs_of(args),
        modes=modes,
        trials=args.trials,
        warmup=args.warmup,
        threads=args.threads,
        n_ctx=args.ctx_size or (4096 if args.paper else None),
        doc_path=args.doc,
        paper=args.paper,
        out_dir=args.out,
        command=shlex.join(["swarmkv", *sys.argv[1:]]),
        memory_probe=args.memory_probe,
        reference_trials=args.reference_trials,
    )
    total = len(opts.configs) * (opts.trials + opts.warmup + opts.memory_probe)
    bench = run_bench(opts, progress=_ProgressBar(total))
    outputs = write_outputs(bench)
    sys.stdout.write(f"wrote {len(outputs.files)} files to {outputs.out_dir}\n")
    for t in outputs.targets:
        sys.stdout.write(
            f"  {t.status:12s} {t.name}: "
            f"{'n/a' if t.value is None else f'{t.value:.2f}'} {t.op} {t.threshold}\n"
        )
    return 0


class _ProgressBar:
    """One tick per finished trial, labelled with what is running (only on a terminal)."""

    def __init__(self, total: int) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, unit="trial", disable=not sys.stderr.isatty())
        self.key: str | None = None

    def __call__(self, message: str) -> None:
        key = message.rsplit(" ", 1)[0]  # "<config> trial <t>" or "<config> memory"
        if self.key is not None and key != self.key:
            self.bar.update(1)
        self.key = key
        self.bar.set_description(message)
