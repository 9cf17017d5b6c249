"""Ctrl-C handling without native code: the worker-thread runner and the DAG's INTERRUPT."""

from __future__ import annotations

import _thread
import threading
import time
from collections.abc import Iterator

import pytest

from swarmkv.dag import Dag, NodeContext
from swarmkv.interrupt import INTERRUPT, Interrupted, check, run_interruptibly


@pytest.fixture(autouse=True)
def clear_interrupt() -> Iterator[None]:
    INTERRUPT.clear()
    yield
    INTERRUPT.clear()


def interrupt_main_after(delay_s: float) -> None:
    def fire() -> None:
        time.sleep(delay_s)
        _thread.interrupt_main()

    threading.Thread(target=fire, daemon=True).start()


def test_ctrl_c_sets_the_flag_and_waits_for_the_worker() -> None:
    unwound: list[str] = []

    def work() -> int:
        try:
            while True:
                check()  # the work's own safe point
                time.sleep(0.01)
        finally:
            time.sleep(0.2)  # freeing handles takes a while; main must wait for it
            unwound.append("done")

    interrupt_main_after(0.1)
    result, interrupted = run_interruptibly(work)
    assert interrupted and result is None
    assert unwound == ["done"], "the main thread returned before the worker unwound"


def test_result_and_errors_pass_through() -> None:
    assert run_interruptibly(lambda: 7) == (7, False)

    def boom() -> None:
        raise ValueError("bug")

    with pytest.raises(ValueError, match="bug"):
        run_interruptibly(boom)


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
