"""`swarmkv bench --serve`: its options, the run, serve.json, the report and plots, and the
targets printed."""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import sys
from typing import Any

from swarmkv.errors import ConfigError

from .probe_words import PROBE_WORDS
from .provenance import provenance

# the goal: a request through the server within this of the in-process Swarm's TTFT
OVERHEAD_GOAL_MS = 10


def _pair(text: str) -> tuple[int, int]:
    """An argparse type: AxB, two integers >= 1 (20x4)."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise argparse.ArgumentTypeError(f"give AxB with integers >= 1, got {text!r}")
    return int(parts[0]), int(parts[1])


def add_serve_options(p: argparse.ArgumentParser) -> None:
    """The serve benchmark's options (`--rates`, `--agents`, `--seed`, `--trials`, `--peers`,
    `-n`, `--doc-tokens` are the bench's own, shared with --swarm)."""
    from .command import count

    g = p.add_argument_group("serve (--serve): agents over HTTP, SwarmKV against llama-server")
    g.add_argument(
        "--serve",
        action="store_true",
        help="agents through the openai client against `swarmkv serve` and llama-server "
        "(-np 1, -np 16 --kv-unified, -np 16), every workload at every --rates, --trials "
        "seeds from --seed; writes serve.json, serve_report.md and plots",
    )
    g.add_argument(
        "--workloads",
        default="shared,multiturn,groups,cold",
        help="comma list of shared (one head, --agents questions), multiturn (--multiturn "
        "agents x turns, each re-sending its history), groups (--groups heads x agents, "
        "interleaved), cold (--agents prompts of their own)",
    )
    g.add_argument("--multiturn", type=_pair, default="20x4", help="AGENTSxTURNS (default 20x4)")
    g.add_argument("--groups", type=_pair, default="4x12", help="HEADSxAGENTS (default 4x12)")
    g.add_argument("--group-tokens", type=count(2), default=2000, help="tokens of each group head")
    g.add_argument("--cold-tokens", type=count(2), default=500, help="tokens of each cold prompt")
    g.add_argument(
        "--burst",
        action="store_true",
        help="one more rate: every agent at once (each system's capacity, the basis of "
        "utilization)",
    )
    g.add_argument(
        "--kernels",
        default="exact,plain",
        help="comma list: exact (SwarmKV's default and the peers' batch-invariant kernels), "
        "plain (swarmkv serve --no-exact and the peers as built)",
    )
    g.add_argument(
        "--ray",
        action="store_true",
        help="with --serve: swarmkv-ray2 too, `swarmkv serve --ray-replicas 2` on the same "
        "cores (the [dist] extra), against one `swarmkv serve`",
    )
    g.add_argument(
        "--probes",
        type=count(1, len(PROBE_WORDS) - 1),
        default=len(PROBE_WORDS) - 1,
        help="with --serve: requests of the HTTP overhead probe (each a question of its own)",
    )
    g.add_argument(
        "--skip-overhead",
        dest="overhead",
        action="store_false",
        help="with --serve: leave out the HTTP overhead probe",
    )
    g.add_argument(
        "--overhead-only",
        action="store_true",
        help="with --serve: only the HTTP overhead probe (no agents, no peers); writes "
        "serve-overhead.json",
    )


def _choices(text: str, allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    got = tuple(x for x in text.split(",") if x)
    bad = [x for x in got if x not in allowed]
    if not got or bad:
        raise ConfigError(
            f"{what}: {', '.join(bad) or 'none given'}; choose from {', '.join(allowed)}"
        )
    return got


def options_of(args: argparse.Namespace, head: str, llama_server: Any) -> Any:
    """ServeBenchOptions from the arguments (ConfigError for a bad list, before any server)."""
    from .serve_bench import ServeBenchOptions
    from .serve_systems import KERNELS, PEERS
    from .serve_workloads import WORKLOADS, Shapes

    peers: tuple[str, ...] = tuple(PEERS)
    if args.peers == "none":
        peers = ()
    elif args.peers not in (None, "all"):
        peers = _choices(args.peers, tuple(PEERS), "unknown --peers for --serve")
    shapes = Shapes(
        head_tokens=args.doc_tokens[0],
        agents=args.agents,
        multiturn_agents=args.multiturn[0],
        turns=args.multiturn[1],
        groups=args.groups[0],
        group_agents=args.groups[1],
        group_tokens=args.group_tokens,
        cold_tokens=args.cold_tokens,
        n_predict=args.n_predict,
    )
    return ServeBenchOptions(
        model=args.model,
        head=head,
        head_tokens=args.doc_tokens[0],
        shapes=shapes,
        workloads=_choices(args.workloads, WORKLOADS, "unknown --workloads"),
        rates=(*args.rates, *((math.inf,) if args.burst else ())),
        threads=args.threads or 2,
        seeds=tuple(args.seed + i for i in range(args.trials)),
        peers=peers if llama_server else (),
        kernels=_choices(args.kernels, KERNELS, "unknown --kernels"),
        llama_server=llama_server if peers else None,
        probes=args.probes,
        overhead=args.overhead,
        ray=args.ray,
    )


def run_serve(args: argparse.Namespace) -> int:
    """Run the serving benchmark (serve_bench.py); writes OUT/serve.json with provenance."""
    from swarmkv.llama.model import Model
    from swarmkv.llama.models import default_model_path

    from .serve_bench import default_llama_server, run_serve_bench, setup_record
    from .serve_overhead import run_overhead_only
    from .workload import document

    args.model = args.model or default_model_path()
    want_peers = args.peers != "none" and not args.overhead_only
    llama_server = default_llama_server() if want_peers else None
    if want_peers and args.peers not in (None, "all") and llama_server is None:
        raise ConfigError(
            "--peers names llama-server setups, and no llama-server is built "
            "(bench/build_llama_server.sh, or set SWARMKV_LLAMA_SERVER)"
        )
    with Model(args.model) as model:
        opts = options_of(args, document(model, args.doc_tokens[0]), llama_server)
        command = shlex.join(["swarmkv", *sys.argv[1:]])
        if args.overhead_only:
            body = run_overhead_only(opts, setup_record(opts))
        else:
            body = run_serve_bench(opts, model)
    result = {"provenance": provenance(command, args.model), **body}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / ("serve-overhead.json" if args.overhead_only else "serve.json")
    path.write_text(json.dumps(result, indent=2, allow_nan=False, default=str) + "\n")
    sys.stdout.write(f"wrote {path}\n")
    if args.overhead_only:
        return _print_overhead_trials(result)
    from .serve_report import write_report

    for written in write_report(result, args.out):
        sys.stdout.write(f"wrote {written}\n")
    if "http_overhead" in result:
        sys.stdout.write(overhead_line(result["http_overhead"]) + "\n")
    for line in target_lines(result["targets"]):
        sys.stdout.write(line + "\n")
    return 0


def _print_overhead_trials(result: dict[str, Any]) -> int:
    for i, trial in enumerate(result["http_overhead_trials"]):
        sys.stdout.write(f"  trial {i}:\n{overhead_line(trial)}\n")
    med, lo, hi = result["summary"]["median_overhead_ms"]
    sys.stdout.write(
        f"  {'PASS' if med <= OVERHEAD_GOAL_MS else 'FAIL'} HTTP overhead within "
        f"{OVERHEAD_GOAL_MS} ms over the trials: median {med:.1f} ms [{lo:.1f}-{hi:.1f}]\n"
    )
    return 0


def overhead_line(oh: dict[str, Any]) -> str:
    """The HTTP overhead probe's summary, against its target."""
    median = oh["median_overhead_ms"]
    lo, hi = oh["overhead_range_ms"]
    tok = oh["tokenize_ms"]
    return (
        f"  {'PASS' if median <= OVERHEAD_GOAL_MS else 'FAIL'} HTTP overhead within "
        f"{OVERHEAD_GOAL_MS} ms: median {median:.1f} ms (range {lo:.1f} to {hi:.1f}) over "
        f"{oh['reps']} probes; client less "
        f"server time to first token: median {oh['median_http_gap_ms']:.1f} ms, of it "
        f"tokenizing the prompt {statistics.median(tok['server_ms']):.2f} ms (the whole text "
        f"would take {statistics.median(tok['whole_ms']):.1f} ms)"
    )


def target_lines(targets: list[dict[str, Any]]) -> list[str]:
    """Each target: PASS/FAIL on its worst seed, its median [min-max], where it was judged."""
    out = []
    for t in targets:
        status = {True: "PASS", False: "FAIL", None: "NOT MEASURED"}[t["pass"]]
        med, lo, hi = t["spread"] or (math.nan,) * 3
        out.append(
            f"  {status:12s} {t['workload']}/{t['kernels']} at rate {t['rate']} ({t['at']}): "
            f"{t['target']} {t['goal']}: {med:.2f} [{lo:.2f}-{hi:.2f}] over seeds"
        )
    return out
