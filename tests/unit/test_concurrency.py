"""ConcurrencyPolicy: how many host or baseline branch contexts run at once, and their threads."""

from __future__ import annotations

import threading

import pytest

from swarmkv.errors import ConfigError
from swarmkv.pipeline.concurrency import AUTO_MAX_CONTEXTS, ConcurrencyPolicy, Slots


def test_by_default_host_splits_the_cores_and_the_baseline_keeps_them() -> None:
    auto = ConcurrencyPolicy()
    assert auto.slots(2, 2, split=True) == Slots(2, 1)  # 2 cores: two contexts of 1 thread
    assert auto.slots(8, 32, split=True) == Slots(AUTO_MAX_CONTEXTS, 2)
    assert auto.slots(3, 2, split=True) == Slots(2, 1)
    assert auto.slots(8, 1, split=True) == Slots(1, None)  # one branch: every core
    assert auto.slots(1, 5, split=True) == Slots(1, None)
    assert auto.slots(8, 32, split=False) == Slots(1, None)  # the baseline


def test_a_given_count_holds_for_every_mode_with_the_pipelines_threads() -> None:
    three = ConcurrencyPolicy(3)
    assert three.slots(2, 8, split=True) == three.slots(2, 8, split=False) == Slots(3, None)
    with pytest.raises(ConfigError, match="max_contexts must be >= 1"):
        ConcurrencyPolicy(0)


def test_slots_hold_at_most_their_count_and_name_the_threads() -> None:
    slots = Slots(2, 1)
    assert slots.overrides() == {"n_threads": 1} and Slots(1, None).overrides() == {}
    inside, most, gate = [0], [0], threading.Lock()

    def work() -> None:
        with slots.hold():
            with gate:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            threading.Event().wait(0.05)
            with gate:
                inside[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 2
