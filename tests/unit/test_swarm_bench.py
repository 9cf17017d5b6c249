"""`swarmkv bench --swarm` pieces that need no model: the arrivals, a rate's entry (stats,
token comparison, failed peer requests) and the report writers with every kind of system."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from swarmkv.engine.result import BranchResult
from swarmkv_bench.command import add_parser
from swarmkv_bench.swarm_arrivals import SystemRun, poisson_arrivals
from swarmkv_bench.swarm_bench import rate_entry
from swarmkv_bench.swarm_plots import write_plots
from swarmkv_bench.swarm_report import live_branches, targets, write_csv, write_markdown

from support.samples import PROVENANCE


def test_arrivals_are_seeded_poisson_with_the_asked_lengths() -> None:
    a = poisson_arrivals(rate=10.0, count=2000, n_min=8, n_max=32, seed=1)
    assert a == poisson_arrivals(rate=10.0, count=2000, n_min=8, n_max=32, seed=1)
    gaps = [y.t_s - x.t_s for x, y in zip([a[0], *a], a, strict=False)][1:]
    assert sum(gaps) / len(gaps) == pytest.approx(0.1, rel=0.1)  # mean gap 1/rate
    assert {x.n_predict for x in a} <= set(range(8, 33)) and len({x.prompt for x in a}) > 1900
    assert a[3].name == "a3"


def _result(i: int, tokens: tuple[int, ...], completion: float, queue: float = 0.0):
    return BranchResult(
        name=f"a{i}", doc="doc", text="", tokens=tokens, stop_reason="length", priority=0,
        prompt_tokens=3, arrival_s=i * 0.1, queue_ms=queue, activation_ms=completion / 2,
        completion_ms=completion, inter_token_ms=(1.0,),
    )  # fmt: skip


def test_rate_entry_compares_with_the_host_lock_and_leaves_failures_out_of_the_stats() -> None:
    host = SystemRun([_result(0, (1, 2), 10.0), _result(1, (3, 4), 40.0, queue=20.0)], 1.0)
    failed = _result(2, (), math.nan)
    peer = SystemRun(
        [_result(0, (1, 2), 20.0), _result(1, (3, 9), 40.0)], 2.0, {"token_ids_withheld": 1}
    )
    broken = SystemRun([_result(0, (1, 2), 10.0), failed], 1.0)
    host_alone = SystemRun([*host.results, _result(2, (5,), 1.0)], 1.0)
    entry = rate_entry(5.0, {"host-lock": host, "server-np1": peer})
    s = entry["systems"]["server-np1"]
    assert s["tokens_identical_to_host_lock"] is False and s["tokens_identical_fraction"] == 0.5
    assert s["tokens"] == 5 and s["tokens_per_s"] == 2.5  # withheld ids were generated too
    assert s["fairness"] == pytest.approx(jain_of([2.0, 2.0]))  # slowdown over time alone
    assert entry["systems"]["host-lock"]["tokens_identical_to_host_lock"] is True
    entry = rate_entry(5.0, {"host-lock": host_alone, "server-npN": broken})
    s = entry["systems"]["server-npN"]
    assert s["failed_branches"] == 1 and s["n_branches"] == 1 and len(s["branches"]) == 2
    assert math.isfinite(s["activation_ms"]["p99"])


def jain_of(xs: list[float]) -> float:
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


def _system(p99: float, tps: float, fairness: float, **more: object) -> dict[str, object]:
    pct = {"p50": p99 / 2, "p95": p99, "p99": p99, "max": p99}
    branch = {"name": "a0", "priority": 0, "prompt_tokens": 5, "tokens": [1, 2], "arrival_s": 0.1,
              "queue_ms": 1.0, "activation_ms": p99, "completion_ms": p99 * 2,
              "stop_reason": "length"}  # fmt: skip
    return {"activation_ms": pct, "queue_ms": pct, "inter_token_ms": pct, "completion_ms": pct,
            "fairness": fairness, "tokens_per_s": tps, "tokens_identical_to_host_lock": True,
            "tokens_identical_fraction": 1.0, "failed_branches": 0, "branches": [branch],
            **more}  # fmt: skip


def _peer(tps: float) -> dict[str, object]:
    s = _system(300, tps, 0.7, server_start_ms=900.0, n_ctx=1024, n_parallel=1,
                prompt_tokens_evaluated=250.0, prompt_tokens_cached=200.0)  # fmt: skip
    s["tokens_identical_to_host_lock"], s["tokens_identical_fraction"] = False, 0.5
    return s


def test_report_states_the_targets_from_the_measured_values(tmp_path: Path) -> None:
    systems = {"host-lock": _system(1000, 10, 0.5), "swarm-fair": _system(100, 20, 0.95),
               "server-np1": _peer(8), "server-npN": _peer(30)}  # fmt: skip
    entry = {"rate": 4.0, "systems": systems}
    report = {"command": "swarmkv bench --swarm", "provenance": PROVENANCE,
              "rates": [entry, {**entry, "rate": 8.0}],
              "options": {"agents": 1, "seed": 0, "n_predict": [2, 2], "doc_tokens": 10,
                          "max_live": 4, "threads": 2,
                          "peers": ["server-np1", "server-npN"]}}  # fmt: skip
    got = {name: (value, goal) for name, value, _, goal in targets(entry)}
    assert got["p99 activation: host-lock / swarm-fair"] == (10.0, 5.0)
    assert got["tokens/s: swarm-fair / host-lock"] == (2.0, 1.5)
    assert got["tokens/s: swarm-fair / server-np1"] == (2.5, 1.5)
    md = write_markdown(report, tmp_path).read_text()
    assert "| swarm-fair | 50 / 100 / 100 |" in md and "| 10.00 | >= 5.0 | met |" in md
    assert "| tokens/s: swarm-fair / server-np1 | 2.50 | >= 1.5 | met |" in md
    assert "| server-npN | 150 / 300 / 300 |" in md and "NO (50% of branches)" in md
    assert "| server-np1 | 1 | 1024 | 250 / 200 | 0 | 0 | 900 |" in md
    assert "warm-up request of the document" in md
    assert "## Provenance" in md and "- llama.cpp commit: 0c1e57098bba" in md
    csv_rows = write_csv(report, tmp_path).read_text().splitlines()
    assert len(csv_rows) == 1 + 8 and "server-npN" in csv_rows[-1]
    assert {p.name for p in write_plots(report, tmp_path)} == {
        "swarm_latency_cdf_4.png",
        "swarm_latency_cdf_8.png",
        "swarm_by_rate.png",
    }
    json.dumps(report)


def test_a_target_whose_system_did_not_run_is_not_applicable(tmp_path: Path) -> None:
    entry = {"rate": 2.0, "systems": {"host-lock": _system(1000, 10, 0.5)}}
    assert all(value is None for _, value, _, _ in targets(entry))
    report = {"command": "c", "provenance": PROVENANCE, "rates": [entry],
              "options": {"agents": 1, "seed": 0,
              "n_predict": [2, 2], "doc_tokens": 10, "max_live": 4, "threads": None}}  # fmt: skip
    md = write_markdown(report, tmp_path).read_text()
    assert "| n/a | >= 1.5 | n/a |" in md and "Not measured here: llama-server" in md


def test_peers_option_takes_a_list_or_nothing() -> None:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    assert parser.parse_args(["bench", "--peers"]).peers == "all"
    assert parser.parse_args(["bench", "--peers", "np1,npN", "--swarm"]).peers == "np1,npN"
    assert parser.parse_args(["bench", "--swarm"]).peers is None


def test_live_branches_is_the_time_weighted_overlap_from_admission_to_the_last_token() -> None:
    def rec(arrival_s: float, queue_ms: float, completion_ms: float) -> dict:
        return {"arrival_s": arrival_s, "queue_ms": queue_ms, "completion_ms": completion_ms}

    # in service: [0, 100], [50, 150], [100, 200] ms; a failed one (NaN) is left out
    branches = [rec(0.0, 0.0, 100.0), rec(0.04, 10.0, 110.0), rec(0.1, 0.0, 100.0)]
    assert live_branches([*branches, rec(0.0, math.nan, math.nan)]) == pytest.approx(1.5)
    assert live_branches([rec(0.0, 0.0, 100.0)]) == pytest.approx(1.0)
    assert math.isnan(live_branches([rec(0.0, math.nan, math.nan)]))
