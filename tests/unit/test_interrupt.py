"""Ctrl-C handling without native code: the SIGINT guard and the DAG's INTERRUPT."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from swarmkv.pipeline.dag import Dag, NodeContext
from swarmkv.process.interrupt import INTERRUPT, Interrupted, check, ctrl_c_sets_flag


@pytest.fixture(autouse=True)
def clear_interrupt() -> Iterator[None]:
    INTERRUPT.clear()
    yield
    INTERRUPT.clear()


def test_ctrl_c_under_the_guard_only_sets_the_flag() -> None:
    before = signal.getsignal(signal.SIGINT)
    with ctrl_c_sets_flag():
        os.kill(os.getpid(), signal.SIGINT)  # would raise KeyboardInterrupt without the guard
        time.sleep(0.05)  # the handler runs at the next bytecode boundary
        assert INTERRUPT.is_set()
        with pytest.raises(Interrupted):
            check()
        os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C must not raise either
        time.sleep(0.05)
    assert signal.getsignal(signal.SIGINT) is before


def test_guard_restores_the_handler_after_an_error() -> None:
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(ValueError, match="bug"), ctrl_c_sets_flag():
        raise ValueError("bug")
    assert signal.getsignal(signal.SIGINT) is before
    assert not INTERRUPT.is_set()


def test_guard_off_the_main_thread_leaves_signals_alone() -> None:
    seen: list[object] = []

    def worker() -> None:
        with ctrl_c_sets_flag():  # signal.signal would raise ValueError here
            seen.append(signal.getsignal(signal.SIGINT))

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == [signal.getsignal(signal.SIGINT)]


def test_dag_stops_its_nodes_then_raises_interrupted() -> None:
    stopped: list[str] = []

    def node(ctx: NodeContext) -> None:
        try:
            while True:
                ctx.check_cancelled()
                time.sleep(0.005)
        finally:
            stopped.append(ctx.name)

    dag = Dag()
    dag.add("a", node)
    dag.add("b", node)
    threading.Timer(0.1, INTERRUPT.set).start()
    with pytest.raises(Interrupted):
        dag.run(timeout_s=30)
    assert sorted(stopped) == ["a", "b"]
