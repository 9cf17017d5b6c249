"""`swarmkv bench`: argument parsing and the call into the harness (no logic of its own)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from swarmkv.errors import ConfigError

from .modes import PEER_PREFIX, PEERS, peer_setups
from .workload import BenchConfig

PAPER_DOC_TOKENS = 3501


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register `swarmkv bench` and its options on the CLI's subparsers; returns it."""
    p = sub.add_parser("bench", help="benchmark baseline vs SwarmKV modes (and llama-server)")
    p.add_argument(
        "--paper",
        action="store_true",
        help="the paper's setup: 3501-token fox document, 2 branches, n_ctx 4096, "
        "16 generated tokens, 3 trials + warm-up",
    )
    p.add_argument("--branches", default="2", help="comma list of branch counts, e.g. 1,2,4,8")
    p.add_argument("--doc-tokens", default=str(PAPER_DOC_TOKENS), help="comma list of sizes")
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
    p.add_argument("-n", "--n-predict", type=int, default=32)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument(
        "--reference-trials",
        type=int,
        default=None,
        metavar="K",
        help="run the baselines in only the first K measured trials, without warm-up (the "
        "report labels them; later trials are checked against their last result): 32 "
        "independent contexts take minutes per trial",
    )
    p.add_argument("--doc", type=Path, default=None, help="a real text file instead of the fox")
    p.add_argument("-m", "--model", type=Path, default=None)
    p.add_argument("-t", "--threads", type=int, default=None)
    p.add_argument("-c", "--ctx-size", type=int, default=None)
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
    g.add_argument("--rates", default="2", help="comma list of arrival rates (per second)")
    g.add_argument("--agents", type=int, default=50, help="agents per rate (default 50)")
    g.add_argument("--n-range", default="32,32", help="n_predict drawn uniformly: MIN,MAX")
    g.add_argument("--policies", default="fifo,fair,priority", help="swarm policies to run")
    g.add_argument("--max-live", type=int, default=16, help="live branches at most")
    g.add_argument("--seed", type=int, default=0, help="seed of the arrivals")


def run_swarm(args: argparse.Namespace) -> int:
    """`swarmkv bench --swarm`: validate, run every rate, print where the outputs went."""
    from swarmkv.engine.policy import make_policy
    from swarmkv.llama.models import default_model_path

    from .peer_server import find_llama_server
    from .swarm_bench import SwarmBenchOptions, run_swarm_bench
    from .swarm_peers import select_peers
    from .swarm_report import format_value, target_status, targets

    rates = tuple(float(r) for r in args.rates.split(",") if r)
    n_range = _ints(args.n_range, "n-range")
    if len(n_range) != 2:
        raise ConfigError(f"--n-range: give MIN,MAX, got {args.n_range!r}")
    n_min, n_max = n_range
    policies = tuple(p for p in args.policies.split(",") if p)
    for p in policies:
        make_policy(p)  # ConfigError naming the choices
    if not rates or min(rates) <= 0 or args.agents < 1 or not 1 <= n_min <= n_max:
        raise ConfigError("--swarm needs rates > 0, --agents >= 1 and 1 <= MIN <= MAX in --n-range")
    peer_bin = find_llama_server()
    peers = select_peers(args.peers, peer_bin)  # ConfigError before the model loads
    opts = SwarmBenchOptions(
        model_path=args.model or default_model_path(),
        rates=rates,
        agents=args.agents,
        n_min=n_min,
        n_max=n_max,
        seed=args.seed,
        policies=policies,
        max_live=args.max_live,
        doc_tokens=_ints(args.doc_tokens, "doc-tokens")[0],
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


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise ConfigError(f"--{what}: expected a comma list of integers, got {text!r}") from exc
    if not values or min(values) < 1:
        raise ConfigError(f"--{what}: values must be >= 1, got {text!r}")
    return values


def configs_of(args: argparse.Namespace) -> tuple[BenchConfig, ...]:
    """The configs the arguments ask for: the paper's one, else each doc-tokens x branches pair.

    ConfigError when --branches or --doc-tokens is not a comma list of integers >= 1.
    """
    if args.paper:
        return (BenchConfig(2, PAPER_DOC_TOKENS, 16),)
    return tuple(
        BenchConfig(n, d, args.n_predict)
        for d in _ints(args.doc_tokens, "doc-tokens")
        for n in _ints(args.branches, "branches")
    )


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

    ConfigError before any model is loaded when matplotlib (the bench extra) is missing.
    """
    require_bench_extra()
    if args.swarm:
        return run_swarm(args)
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
