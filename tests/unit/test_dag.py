"""Unit tests of the pipeline DAG with fake nodes; every run has a timeout so a bug fails fast."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from swarmkv.errors import CycleError, DagError, PipelineError, SwarmKVError
from swarmkv.pipeline.dag import Cancelled, Dag, DagResult, Dep, NodeContext, NodeResult

# Every run in these tests is bounded: a scheduling bug fails the test instead of hanging it.
RUN_TIMEOUT_S = 2.0
EVENT_TIMEOUT_S = 2.0


def const(value: Any) -> Any:
    return lambda ctx: value


def boom(ctx: NodeContext) -> None:
    raise ValueError(f"boom in {ctx.name}")


def test_nodes_run_after_their_dependencies_and_get_their_values() -> None:
    seq: list[str] = []
    lock = threading.Lock()

    def node(value: int) -> Any:
        def fn(ctx: NodeContext) -> int:
            with lock:
                seq.append(ctx.name)
            time.sleep(0.01)  # widen the window in which a premature start would show
            return value + sum(ctx.inputs.values())

        return fn

    dag = Dag()
    dag.add("d", node(1000), after=["b", "c"])
    dag.add("b", node(10), after=["a"])
    dag.add("c", node(100), after=["a"])
    dag.add("a", node(1))
    res = dag.run(timeout_s=RUN_TIMEOUT_S)

    assert res.ok
    assert seq[0] == "a" and seq[-1] == "d"
    assert res["d"].value == 1000 + (10 + 1) + (100 + 1)
    assert list(res.results) == ["a", "b", "c", "d"]
    for child, parents in {"b": ["a"], "c": ["a"], "d": ["b", "c"]}.items():
        for parent in parents:
            started, finished = res[child].started_s, res[parent].finished_s
            assert started is not None and finished is not None and started >= finished


def test_independent_nodes_run_concurrently() -> None:
    barrier = threading.Barrier(2, timeout=EVENT_TIMEOUT_S)
    dag = Dag()
    dag.add("x", lambda ctx: barrier.wait())
    dag.add("y", lambda ctx: barrier.wait())
    res = dag.run(timeout_s=RUN_TIMEOUT_S)
    assert res.ok, res.results


def test_worker_threads_are_named_and_daemon() -> None:
    dag = Dag()
    dag.add("prefill", lambda ctx: (threading.current_thread().name, threading.current_thread()))
    name, thread = dag.run(timeout_s=RUN_TIMEOUT_S)["prefill"].value
    assert name == "swarmkv-node-prefill"
    assert thread.daemon


def test_order_is_topological_with_insertion_tiebreak() -> None:
    dag = Dag()
    dag.add("z", const(0), after=["m"])
    dag.add("m", const(0))
    dag.add("b", const(0))
    dag.add("a", const(0), after=["b"])
    assert dag.order() == ["m", "z", "b", "a"]
    assert dag.order() == dag.order()


def test_cycle_error_names_the_path() -> None:
    dag = Dag()
    dag.add("x", const(0), after=["a"])
    dag.add("a", const(0), after=["b"])
    dag.add("b", const(0), after=["c"])
    dag.add("c", const(0), after=["a"])
    with pytest.raises(CycleError, match="a -> b -> c -> a") as info:
        dag.validate()
    assert info.value.cycle == ["a", "b", "c", "a"]
    assert isinstance(info.value, DagError)
    with pytest.raises(CycleError):
        dag.order()


def test_cycle_through_signal_dependency_is_detected() -> None:
    dag = Dag()
    dag.add("a", const(0), after=[Dep("b", signal="s")])
    dag.add("b", const(0), after=["a"])
    with pytest.raises(CycleError, match="a -> b -> a"):
        dag.validate()


def test_self_edge_is_rejected() -> None:
    dag = Dag()
    with pytest.raises(DagError, match="itself"):
        dag.add("a", const(0), after=["a"])
        dag.validate()


def test_unknown_dependency_names_both_nodes() -> None:
    dag = Dag()
    dag.add("branch", const(0), after=["nosuch"])
    with pytest.raises(DagError, match=r"'branch'.*'nosuch'"):
        dag.validate()


def test_duplicate_and_bad_names_are_rejected() -> None:
    dag = Dag()
    dag.add("a", const(0))
    with pytest.raises(DagError, match="duplicate"):
        dag.add("a", const(1))
    for bad in ["", "a@b"]:
        with pytest.raises(DagError):
            dag.add(bad, const(0))
    with pytest.raises(DagError):
        dag.add("c", const(0), after=[Dep("a", signal="")])
    with pytest.raises(DagError):
        dag.add("d", const(0), after=[42])  # type: ignore[list-item]


def test_validation_happens_before_any_node_runs() -> None:
    called: list[str] = []

    def record(ctx: NodeContext) -> None:
        called.append(ctx.name)

    dag = Dag()
    dag.add("fine", record)
    dag.add("also_fine", record, after=["fine"])
    dag.add("p", record, after=["q"])
    dag.add("q", record, after=["p"])
    with pytest.raises(CycleError):
        dag.run(timeout_s=RUN_TIMEOUT_S)
    time.sleep(0.05)  # a wrongly started worker would have recorded by now
    assert called == []


def test_failure_skips_dependents_transitively_and_siblings_finish() -> None:
    dag = Dag()
    dag.add("root", const(1))
    dag.add("bad", boom, after=["root"])
    dag.add("child", const(2), after=["bad"])
    dag.add("grandchild", const(3), after=["child", "root"])
    dag.add("sibling", const(4), after=["root"])
    res = dag.run(timeout_s=RUN_TIMEOUT_S)

    assert not res.ok
    assert res["bad"].status == "failed"
    assert isinstance(res["bad"].error, ValueError)
    assert [r.name for r in res.failed()] == ["bad"]
    for name in ["child", "grandchild"]:
        assert res[name].status == "skipped"
        assert res[name].reason == "upstream bad failed"
        assert res[name].started_s is None
    assert res["sibling"].status == "ok" and res["sibling"].value == 4


def test_raise_on_failure_raises_pipeline_error() -> None:
    dag = Dag()
    dag.add("one", boom)
    dag.add("two", boom)
    dag.add("fine", const(0))
    with pytest.raises(PipelineError, match=r"one: ValueError.*two: ValueError") as info:
        dag.run(timeout_s=RUN_TIMEOUT_S, raise_on_failure=True)
    assert isinstance(info.value.__cause__, ValueError)
    res = dag.run(timeout_s=RUN_TIMEOUT_S)
    with pytest.raises(PipelineError):
        res.raise_for_failure()


def test_successful_result_accessors() -> None:
    dag = Dag()
    dag.add("a", const("A"))
    res = dag.run(timeout_s=RUN_TIMEOUT_S, raise_on_failure=True)
    assert isinstance(res, DagResult) and isinstance(res["a"], NodeResult)
    assert res.ok and res.failed() == []
    assert res["a"].value == "A" and res["a"].error is None and res["a"].reason is None
    res.raise_for_failure()


def test_signal_dependency_starts_before_upstream_completes() -> None:
    branch_started = threading.Event()

    def prefill(ctx: NodeContext) -> str:
        ctx.publish("prefix:2", "first-two")
        # Waiting for the branch here deadlocks if signal deps waited for completion.
        if not branch_started.wait(EVENT_TIMEOUT_S):
            raise AssertionError("branch did not start while prefill was running")
        return "all"

    def branch(ctx: NodeContext) -> Any:
        branch_started.set()
        return ctx.inputs

    dag = Dag()
    dag.add("doc", prefill)
    dag.add("branch", branch, after=[Dep("doc", signal="prefix:2")])
    dag.add("tail", lambda ctx: ctx.inputs, after=["doc", "branch"])
    res = dag.run(timeout_s=RUN_TIMEOUT_S)

    assert res.ok, res.results
    assert res["branch"].value == {"doc@prefix:2": "first-two"}
    assert res["tail"].value == {"doc": "all", "branch": {"doc@prefix:2": "first-two"}}
    branch_start, doc_end = res["branch"].started_s, res["doc"].finished_s
    assert branch_start is not None and doc_end is not None and branch_start < doc_end


def test_upstream_finishing_without_publishing_skips_dependent() -> None:
    dag = Dag()
    dag.add("doc", lambda ctx: ctx.publish("other", 1))
    dag.add("branch", const(0), after=[Dep("doc", signal="prefix:8")])
    dag.add("leaf", const(0), after=["branch"])
    dag.add("plain", const(1), after=["doc"])
    res = dag.run(timeout_s=RUN_TIMEOUT_S)

    reason = "upstream doc finished without publishing prefix:8"
    assert res["branch"].status == "skipped" and res["branch"].reason == reason
    assert res["leaf"].status == "skipped" and res["leaf"].reason == reason
    assert res["plain"].status == "ok"


def test_failed_upstream_skips_signal_dependents() -> None:
    dag = Dag()
    dag.add("doc", boom)
    dag.add("branch", const(0), after=[Dep("doc", signal="prefix:8")])
    res = dag.run(timeout_s=RUN_TIMEOUT_S)
    assert res["branch"].status == "skipped"
    assert res["branch"].reason == "upstream doc failed"


def test_publishing_a_signal_twice_fails_the_node() -> None:
    def twice(ctx: NodeContext) -> None:
        ctx.publish("s", 1)
        ctx.publish("s", 2)

    dag = Dag()
    dag.add("doc", twice)
    dag.add("branch", lambda ctx: ctx.inputs["doc@s"], after=[Dep("doc", "s")])
    res = dag.run(timeout_s=RUN_TIMEOUT_S)
    assert res["doc"].status == "failed"
    assert isinstance(res["doc"].error, DagError)
    assert res["branch"].status == "ok" and res["branch"].value == 1  # published before


def cooperative(ctx: NodeContext) -> None:
    deadline = time.perf_counter() + EVENT_TIMEOUT_S
    while not ctx.cancelled and time.perf_counter() < deadline:
        time.sleep(0.005)
    ctx.check_cancelled()
    raise AssertionError("never cancelled")


def test_timeout_cancels_running_node_and_its_dependents() -> None:
    dag = Dag()
    dag.add("slow", cooperative)
    dag.add("after", const(0), after=["slow"])
    dag.add("fast", const(1))
    t0 = time.perf_counter()
    res = dag.run(timeout_s=0.2)
    elapsed = time.perf_counter() - t0

    assert 0.15 < elapsed < 1.0
    assert res["slow"].status == "cancelled"
    assert res["slow"].reason == "pipeline timeout after 0.2 s"
    assert isinstance(res["slow"].error, Cancelled)
    assert isinstance(res["slow"].error, SwarmKVError)
    assert res["after"].status in {"cancelled", "skipped"}
    assert res["fast"].status == "ok"
    assert not res.ok and res.failed() == []


def test_run_waits_for_a_node_that_stops_late() -> None:
    # The teardown contract: run() returns only after every node thread has ended, because
    # the caller frees native handles right after it. A node that notices cancellation late
    # delays run(); it is never abandoned while it may still be using them.
    finished: list[float] = []

    def stubborn(ctx: NodeContext) -> str:
        time.sleep(0.4)  # ignores cancellation for a while (one long native call)
        finished.append(time.perf_counter())
        return "done"

    dag = Dag()
    dag.add("stubborn", stubborn)
    dag.add("after", const(0), after=["stubborn"])
    t0 = time.perf_counter()
    res = dag.run(timeout_s=0.1)
    returned = time.perf_counter()
    assert finished and returned >= finished[0], "run() returned before the node ended"
    assert returned - t0 >= 0.4
    assert res["stubborn"].status == "ok" and res["stubborn"].value == "done"
    assert res["after"].status == "cancelled" and res["after"].started_s is None
    assert [t for t in threading.enumerate() if t.name.startswith("swarmkv-node-")] == []


def test_keyboard_interrupt_joins_every_node_then_raises() -> None:
    ended: list[str] = []

    def worker(ctx: NodeContext) -> None:
        try:
            cooperative(ctx)
        finally:
            ended.append(ctx.name)

    def interrupt(ctx: NodeContext) -> None:
        # KeyboardInterrupt lands in the main thread, which is inside run()
        import _thread

        time.sleep(0.1)
        _thread.interrupt_main()

    dag = Dag()
    dag.add("a", worker)
    dag.add("b", worker)
    dag.add("signal", interrupt)
    with pytest.raises(KeyboardInterrupt):
        dag.run(timeout_s=RUN_TIMEOUT_S)
    assert sorted(ended) == ["a", "b"], "every node ended before the interrupt propagated"
    assert [t for t in threading.enumerate() if t.name.startswith("swarmkv-node-")] == []


def test_node_raising_cancelled_is_cancelled_not_failed() -> None:
    def give_up(ctx: NodeContext) -> None:
        raise Cancelled("gave up")

    dag = Dag()
    dag.add("a", give_up)
    dag.add("b", const(0), after=["a"])
    res = dag.run(timeout_s=RUN_TIMEOUT_S, raise_on_failure=True)
    assert res["a"].status == "cancelled" and res["a"].reason == "gave up"
    assert res["b"].status == "skipped" and res["b"].reason == "upstream a cancelled"


def test_external_cancel_event_stops_running_and_pending_nodes() -> None:
    cancel = threading.Event()
    started = threading.Event()

    def slow(ctx: NodeContext) -> None:
        started.set()
        cooperative(ctx)

    def cancel_when_started() -> None:
        if started.wait(EVENT_TIMEOUT_S):
            cancel.set()

    canceller = threading.Thread(target=cancel_when_started, daemon=True)
    canceller.start()
    dag = Dag()
    dag.add("slow", slow)
    dag.add("after", const(0), after=["slow"])
    t0 = time.perf_counter()
    res = dag.run(timeout_s=RUN_TIMEOUT_S, cancel=cancel)
    canceller.join(EVENT_TIMEOUT_S)

    assert time.perf_counter() - t0 < 1.0
    assert res["slow"].status == "cancelled" and res["slow"].reason == "cancelled"
    assert res["after"].status == "cancelled" and res["after"].started_s is None


def test_cancel_set_before_run_starts_no_node() -> None:
    called: list[str] = []
    cancel = threading.Event()
    cancel.set()
    dag = Dag()
    dag.add("a", lambda ctx: called.append(ctx.name))
    dag.add("b", lambda ctx: called.append(ctx.name), after=["a"])
    res = dag.run(timeout_s=RUN_TIMEOUT_S, cancel=cancel)
    assert called == []
    assert all(r.status == "cancelled" and r.reason == "cancelled" for r in res.results.values())


def test_dag_can_be_run_again() -> None:
    runs: list[int] = []

    def doc(ctx: NodeContext) -> int:
        ctx.publish("prefix:1", len(runs))
        runs.append(1)
        return len(runs)

    dag = Dag()
    dag.add("doc", doc)
    dag.add("branch", lambda ctx: ctx.inputs["doc@prefix:1"], after=[Dep("doc", "prefix:1")])
    dag.add("tail", lambda ctx: ctx.inputs["doc"], after=["doc"])
    first = dag.run(timeout_s=RUN_TIMEOUT_S)
    second = dag.run(timeout_s=RUN_TIMEOUT_S)
    assert first.ok and second.ok
    assert (first["branch"].value, first["tail"].value) == (0, 1)
    assert (second["branch"].value, second["tail"].value) == (1, 2)


@pytest.mark.parametrize(("timeout_s", "warn_s"), [(0.0, 1.0), (-1.0, 1.0), (1.0, -0.5), (1.0, 0)])
def test_bad_run_arguments_are_rejected(timeout_s: float, warn_s: float) -> None:
    dag = Dag()
    dag.add("a", const(0))
    with pytest.raises(SwarmKVError):
        dag.run(timeout_s=timeout_s, warn_every_s=warn_s)
