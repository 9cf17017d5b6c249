"""TrialRecord built from pipeline results (duck-typed fakes) and the per-trial fidelity check."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from swarmkv_bench.records import TrialRecord, check_fidelity, from_pipeline_result


@dataclass
class FakeBranch:
    tokens: tuple[int, ...]
    activation_ms: float = 10.0
    restore_ms: float | None = None
    fork_copy_ms: float | None = None
    prefill_ms: float | None = None
    decode_ms: float = 50.0
    first_token_ms: float = 20.0
    end_ms: float = 80.0
    step_logits: tuple[np.ndarray, ...] = ()


@dataclass
class FakeResult:
    mode: str
    branches: dict[str, Any]
    prefix_tokens: int = 100
    prefill_ms: float = 30.0
    snapshot_bytes: int = 0
    e2e_ms: float = 100.0
    kv_bytes: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _baseline() -> FakeResult:
    return FakeResult(
        "baseline",
        {
            "a": FakeBranch((1, 2, 3), activation_ms=40.0, prefill_ms=29.0),
            "b": FakeBranch((4, 5, 6), activation_ms=41.0, prefill_ms=31.0),
        },
    )


def test_record_of_a_matching_run_carries_every_metric() -> None:
    base = _baseline()
    fork = FakeResult(
        "fork",
        {
            # The fork run finished b first: the record still follows the baseline's order.
            "b": FakeBranch((4, 5, 6), activation_ms=3.0, restore_ms=0.5),
            "a": FakeBranch((1, 2, 3), activation_ms=2.0, restore_ms=0.4),
        },
        snapshot_bytes=1234,
        e2e_ms=60.0,
        kv_bytes=999,
    )
    r = from_pipeline_result(fork, config_id="c", trial=2, n_predict=3, baseline=base)
    assert r.mode == "fork" and r.trial == 2 and r.n_branches == 2 and r.doc_tokens == 100
    assert r.branch_names == ("a", "b")
    assert r.activation_ms == (2.0, 3.0)
    assert r.restore_ms == (0.4, 0.5)
    assert r.snapshot_bytes == 1234 and r.kv_bytes == 999
    assert r.tokens_generated == 6
    assert r.tokens_per_s == 6 / 0.060
    assert r.fidelity_ok is True
    assert "a: 3 tokens equal" in r.fidelity_detail


def test_the_reference_run_is_not_checked_and_sums_its_prefills() -> None:
    base = _baseline()
    r = from_pipeline_result(base, config_id="c", trial=0, n_predict=3)
    assert r.fidelity_ok is None
    assert r.branch_prefill_ms == (29.0, 31.0)
    assert r.prefill_total_ms == 60.0
    assert r.restore_ms == (None, None)


def test_divergent_tokens_without_logits_are_a_mismatch() -> None:
    bad = FakeResult("fork", {"a": FakeBranch((1, 2, 3)), "b": FakeBranch((4, 9, 6))})
    r = from_pipeline_result(bad, config_id="c", trial=1, n_predict=3, baseline=_baseline())
    assert r.fidelity_ok is False
    assert "b: diverged at step 1" in r.fidelity_detail


def test_a_near_tie_divergence_passes_and_is_counted() -> None:
    vocab = 8
    base_logits = tuple(np.linspace(-1.0, 1.0, vocab, dtype=np.float32) for _ in range(3))
    base_logits[1][4], base_logits[1][7] = 5.0, 4.99  # top-2 margin 0.01
    mine = tuple(x.copy() for x in base_logits)
    mine[1][7] = 5.02  # moved by 0.03 > margin: a near-tie
    base = FakeResult("baseline", {"a": FakeBranch((1, 4, 3), step_logits=base_logits)})
    fork = FakeResult("fork", {"a": FakeBranch((1, 7, 3), step_logits=mine)})
    host = FakeResult("host", {"a": FakeBranch((1, 4, 3))})  # the replay reproduces the base
    r = from_pipeline_result(fork, config_id="c", trial=1, n_predict=3, baseline=base, replay=host)
    assert r.fidelity_ok is True
    assert r.extra["fidelity_near_ties"] == 1.0
    assert "near-tie" in r.fidelity_detail and "replay matches" in r.fidelity_detail
    assert r.extra["first_nmse_max"] == 0.0
    # the same divergence without a replay, or in a mode that claims exactness, fails
    r = from_pipeline_result(fork, config_id="c", trial=1, n_predict=3, baseline=base)
    assert r.fidelity_ok is False and "no replay" in r.fidelity_detail
    r = from_pipeline_result(
        fork, config_id="c", trial=1, n_predict=3, baseline=base, replay=host, exact=True
    )
    assert r.fidelity_ok is False and "exact mode: failure" in r.fidelity_detail


def test_a_missing_branch_keeps_indices_and_fails_fidelity() -> None:
    part = FakeResult("fork", {"b": FakeBranch((4, 5, 6), activation_ms=3.0)})
    r = from_pipeline_result(part, config_id="c", trial=1, n_predict=3, baseline=_baseline())
    assert math.isnan(r.activation_ms[0]) and r.activation_ms[1] == 3.0
    assert r.fidelity_ok is False
    assert "a: no output" in r.fidelity_detail


def test_a_run_with_no_branches_fails_fidelity() -> None:
    empty = FakeResult("fork", {})
    r = from_pipeline_result(empty, config_id="c", trial=1, n_predict=3, baseline=_baseline())
    assert r.fidelity_ok is False


def test_peer_tokens_are_compared_when_present() -> None:
    base = _baseline()
    assert check_fidelity({"a": [1, 2, 3], "b": [4, 5, 6]}, base).ok is True
    assert check_fidelity({"a": [1, 2, 3], "b": [4, 5, 7]}, base).ok is False
    assert check_fidelity({}, base).ok is None
    assert check_fidelity({"a": [1]}, None).ok is None


def test_record_to_dict_is_strict_json() -> None:
    r = TrialRecord(
        config_id="c",
        n_branches=1,
        doc_tokens=1,
        n_predict=1,
        mode="m",
        trial=0,
        e2e_ms=0.0,
        activation_ms=(math.nan,),
    )
    d = r.to_dict()
    assert d["activation_ms"] == [None]
    assert d["tokens_per_s"] is None


def test_fidelity_describe_without_logits() -> None:
    from swarmkv.pipeline.fidelity import compare

    assert "n/a" in compare([1, 2], [1, 2]).describe()
    assert "counted as a mismatch" in compare([1, 3], [1, 2]).describe()
