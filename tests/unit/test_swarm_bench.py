"""`swarmkv bench --swarm` pieces that need no model: the arrivals and the report writers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swarmkv_bench.swarm_bench import poisson_arrivals
from swarmkv_bench.swarm_report import targets, write_csv, write_markdown, write_plots


def test_arrivals_are_seeded_poisson_with_the_asked_lengths() -> None:
    a = poisson_arrivals(rate=10.0, count=2000, n_min=8, n_max=32, seed=1)
    assert a == poisson_arrivals(rate=10.0, count=2000, n_min=8, n_max=32, seed=1)
    gaps = [y.t_s - x.t_s for x, y in zip([a[0], *a], a, strict=False)][1:]
    assert sum(gaps) / len(gaps) == pytest.approx(0.1, rel=0.1)  # mean gap 1/rate
    assert {x.n_predict for x in a} <= set(range(8, 33)) and len({x.prompt for x in a}) > 1900


def _system(p99: float, tps: float, fairness: float) -> dict[str, object]:
    pct = {"p50": p99 / 2, "p95": p99, "p99": p99, "max": p99}
    branch = {"name": "a0", "priority": 0, "prompt_tokens": 5, "tokens": [1, 2], "arrival_s": 0.1,
              "queue_ms": 1.0, "activation_ms": p99, "completion_ms": p99 * 2}  # fmt: skip
    return {"activation_ms": pct, "queue_ms": pct, "inter_token_ms": pct, "completion_ms": pct,
            "fairness": fairness, "tokens_per_s": tps, "tokens_identical_to_host_lock": True,
            "branches": [branch]}  # fmt: skip


def test_report_states_the_targets_from_the_measured_values(tmp_path: Path) -> None:
    entry = {"rate": 4.0, "systems": {"host-lock": _system(1000, 10, 0.5),
                                      "swarm-fair": _system(100, 20, 0.95)}}  # fmt: skip
    report = {"command": "swarmkv bench --swarm", "rates": [entry, {**entry, "rate": 8.0}],
              "options": {"agents": 1, "seed": 0, "n_predict": [2, 2], "doc_tokens": 10,
                          "max_live": 4, "threads": 2}}  # fmt: skip
    got = {name: (value, goal) for name, value, _, goal in targets(entry)}
    assert got["p99 activation: host-lock / swarm-fair"] == (10.0, 5.0)
    assert got["tokens/s: swarm-fair / host-lock"] == (2.0, 1.5)
    md = write_markdown(report, tmp_path).read_text()
    assert "| swarm-fair | 50 / 100 / 100 |" in md and "| 10.00 | >= 5.0 | met |" in md
    assert len(write_csv(report, tmp_path).read_text().splitlines()) == 1 + 4
    assert {p.name for p in write_plots(report, tmp_path)} == {
        "swarm_activation_cdf_4.png",
        "swarm_activation_cdf_8.png",
        "swarm_by_rate.png",
    }
    json.dumps(report)
