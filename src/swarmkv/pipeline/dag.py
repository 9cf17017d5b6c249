"""Run pipeline nodes (prefill, branches) as a dependency graph on a bounded set of threads.

A node waits either for another node to *complete* or only until it *publishes* a named
signal (a watermark such as "prefix:512"), so a branch that needs the first W document
tokens can start while the prefill still runs. The graph is validated before any node
runs; a failure skips only its dependents; a timeout, Ctrl-C or the caller's cancel Event
stops the run cooperatively (nodes check between steps of their work).

Teardown contract: `run()` returns or raises only after every node thread has ended, on every
path (success, failure, timeout, cancel, KeyboardInterrupt). Nodes use native handles that
the caller frees right after `run()`; returning earlier would free them under a running
thread (a segfault, found by sending Ctrl-C to `swarmkv run`).

Threads: a node gets a worker thread only once its inputs are ready and fewer than
`max_workers` nodes are running; the calling thread decides, so a node waiting for its inputs
holds no thread (256 host branches run on max_contexts + 1 threads, not 257).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Any, Literal

from ..checks import check_int, check_seconds
from ..errors import DagError, PipelineError, SwarmKVError
from ..process.interrupt import INTERRUPT
from ..process.interrupt import check as check_interrupt
from ..process.threads import Worker, wait_all
from .dag_graph import topo_order
from .dag_graph import validate as validate_graph

__all__ = [
    "Cancelled",
    "Dag",
    "DagResult",
    "Dep",
    "NodeContext",
    "NodeResult",
    "NodeStatus",
    "StopWhen",
]

_log = logging.getLogger("swarmkv.pipeline.dag")

# How often run() looks at the caller's cancel Event and the process-wide INTERRUPT.
_POLL_S = 0.02

NodeStatus = Literal["ok", "failed", "skipped", "cancelled"]


class Cancelled(SwarmKVError):
    """Raised by `NodeContext.check_cancelled()`; a node raising it ends `cancelled`."""


@dataclass
class StopWhen:
    """Why a run must stop, in this order: the caller's cancel Event, Ctrl-C (INTERRUPT), its
    timeout. The one rule for a DAG run and for fork's engine loop, so both report the same
    reasons."""

    timeout_s: float | None = None
    cancel: threading.Event | None = None
    start: float = field(default_factory=time.perf_counter)

    @property
    def deadline(self) -> float | None:
        """perf_counter() at which the timeout fires, or None."""
        return None if self.timeout_s is None else self.start + self.timeout_s

    def reason(self) -> str | None:
        """The reason to stop now, or None to go on."""
        if self.cancel is not None and self.cancel.is_set():
            return "cancelled"
        if INTERRUPT.is_set():
            return "interrupted"
        deadline = self.deadline
        if deadline is not None and time.perf_counter() >= deadline:
            return f"pipeline timeout after {self.timeout_s:g} s"
        return None

    def check(self) -> None:
        """Raise Cancelled with the reason, if there is one; call between steps."""
        reason = self.reason()
        if reason is not None:
            raise Cancelled(reason)


@dataclass(frozen=True)
class Dep:
    """Wait for `node` to complete or, with `signal`, only until it publishes that signal."""

    node: str
    signal: str | None = None

    @property
    def key(self) -> str:
        """The key of this dependency's value in `NodeContext.inputs`."""
        return self.node if self.signal is None else f"{self.node}@{self.signal}"


@dataclass(frozen=True)
class NodeResult:
    """How one node ended; `finished_s` is when its status was settled (perf_counter)."""

    name: str
    status: NodeStatus
    value: Any = None
    error: BaseException | None = None
    reason: str | None = None
    started_s: float | None = None
    finished_s: float | None = None


@dataclass(frozen=True)
class DagResult:
    """Every node's result, in topological order."""

    results: dict[str, NodeResult]

    @property
    def ok(self) -> bool:
        """Whether every node finished with status ok."""
        return all(r.status == "ok" for r in self.results.values())

    def failed(self) -> list[NodeResult]:
        """The results of nodes whose status is failed, in topological order."""
        return [r for r in self.results.values() if r.status == "failed"]

    def __getitem__(self, name: str) -> NodeResult:
        return self.results[name]

    def raise_for_failure(self) -> None:
        """Raise PipelineError naming each failed node; skipped/cancelled alone do not raise."""
        failed = self.failed()
        if failed:
            listing = "; ".join(f"{r.name}: {r.error!r}" for r in failed)
            message = f"{len(failed)} pipeline node(s) failed: {listing}"
            raise PipelineError(message) from failed[0].error


@dataclass(frozen=True)
class _Node:
    name: str
    fn: Callable[[NodeContext], Any]
    deps: tuple[Dep, ...]

    def dep_names(self) -> list[str]:
        """The nodes this node waits for, each once, in declaration order."""
        return list(dict.fromkeys(d.node for d in self.deps))


@dataclass(frozen=True)
class _Outcome:
    """What a dependency future resolves to: a value, or why dependents must be skipped."""

    value: Any = None
    skip: str | None = None


class NodeContext:
    """What a node function sees: its inputs, a way to publish signals, the cancel flag."""

    __slots__ = ("_run", "inputs", "name")

    def __init__(self, name: str, inputs: dict[str, Any], run: _Run) -> None:
        self.name = name
        self.inputs = inputs
        self._run = run

    def publish(self, signal: str, value: Any = None) -> None:
        """Release dependents waiting on `signal`; a signal may be published once."""
        self._run.publish(self.name, signal, value)

    @property
    def cancelled(self) -> bool:
        """Whether the run was cancelled, interrupted or timed out (see check_cancelled)."""
        return self._run.cancel_reason() is not None

    def check_cancelled(self) -> None:
        """Raise Cancelled if the run was cancelled; call between steps of long work."""
        reason = self._run.cancel_reason()
        if reason is not None:
            raise Cancelled(f"node {self.name!r} cancelled: {reason}")


class Dag:
    """Named nodes and their dependency edges; `run()` executes them, once or many times."""

    def __init__(self) -> None:
        self._nodes: dict[str, _Node] = {}

    def add(
        self, name: str, fn: Callable[[NodeContext], Any], after: Iterable[str | Dep] = ()
    ) -> None:
        """Add a node; names must be unique, non-empty and free of "@" (used in input keys)."""
        if not isinstance(name, str) or not name or "@" in name:
            raise DagError(f"node name must be a non-empty string without '@', got {name!r}")
        if name in self._nodes:
            raise DagError(f"duplicate node name {name!r}")
        if not callable(fn):
            raise DagError(f"node {name!r}: fn must be callable, got {type(fn).__name__}")
        deps = tuple(dict.fromkeys(_as_dep(name, d) for d in after))
        self._nodes[name] = _Node(name, fn, deps)

    def validate(self) -> None:
        """Raise DagError (self-edge, unknown name) or CycleError; runs no node."""
        validate_graph(self._nodes)

    def order(self) -> list[str]:
        """A topological order; among ready nodes the earliest added comes first."""
        validate_graph(self._nodes)
        return topo_order(self._nodes)

    def run(
        self,
        *,
        timeout_s: float | None = None,
        raise_on_failure: bool = False,
        cancel: threading.Event | None = None,
        warn_every_s: float = 5.0,
        max_workers: int | None = None,
    ) -> DagResult:
        """Run every node, at most max_workers at once (default: no limit), each on a worker
        thread started when its inputs are ready, and wait for all of them to end.

        After a timeout, a cancel or Ctrl-C, running nodes are asked to stop and joined (nodes
        not started yet end `cancelled`); every `warn_every_s` seconds a warning names the
        nodes still being waited for. A KeyboardInterrupt is re-raised once every thread has
        ended.
        """
        check_seconds("timeout_s", timeout_s)
        check_seconds("warn_every_s", warn_every_s)
        if max_workers is not None:
            check_int("max_workers", max_workers, lo=1)
        nodes = dict(self._nodes)  # a snapshot, so add() during a run cannot change it
        validate_graph(nodes)
        order = topo_order(nodes)
        run = _Run(nodes, StopWhen(timeout_s, cancel))
        workers: list[Worker] = []
        try:
            run.supervise(order, max_workers or len(order) or 1, workers)
        except BaseException:
            # Interrupted (or out of threads): stop every worker and wait for it to end.
            run.stop("interrupted")
            wait_all(workers, warn_every_s)
            raise
        if wait_all(workers, warn_every_s, on_interrupt=lambda: run.stop("interrupted")):
            raise KeyboardInterrupt
        check_interrupt()  # Ctrl-C in a CLI: every node has stopped; unwind the caller too
        result = run.collect(order)
        if raise_on_failure:
            result.raise_for_failure()
        return result


def _as_dep(owner: str, dep: str | Dep) -> Dep:
    if isinstance(dep, str):
        dep = Dep(dep)
    if not isinstance(dep, Dep):
        raise DagError(f"node {owner!r}: dependency must be str or Dep, got {dep!r}")
    if dep.signal is not None and (not isinstance(dep.signal, str) or not dep.signal):
        raise DagError(f"node {owner!r}: signal of {dep.node!r} must be a non-empty string")
    return dep


def failure_reason(exc: BaseException) -> str:
    """The reason a failed node reports: never empty, since some exceptions carry no
    message (MemoryError(), KeyError()); then the exception's type names the cause."""
    return str(exc) or type(exc).__name__


def _settled(
    name: str, status: NodeStatus, started: float | None = None, **fields: Any
) -> NodeResult:
    return NodeResult(name, status, started_s=started, finished_s=time.perf_counter(), **fields)


def _outcome_of(result: NodeResult) -> _Outcome:
    if result.status == "ok":
        return _Outcome(value=result.value)
    if result.status == "skipped":
        return _Outcome(skip=result.reason)  # keeps naming the nearest failed ancestor
    return _Outcome(skip=f"upstream {result.name} {result.status}")


class _Run:
    """The state of one run: fresh futures each time, so a Dag can be run again."""

    def __init__(self, nodes: dict[str, _Node], when: StopWhen) -> None:
        self._nodes = nodes
        self._when = when
        self._lock = threading.Lock()
        self._stop: Future[None] = Future()
        self._stop_reason: str | None = None
        self._closed = False
        self._done: dict[str, Future[_Outcome]] = {name: Future() for name in nodes}
        self._signals: dict[tuple[str, str], Future[_Outcome]] = {
            (d.node, d.signal): Future()
            for node in nodes.values()
            for d in node.deps
            if d.signal is not None
        }
        self._published: set[tuple[str, str]] = set()
        self._started: dict[str, float] = {}
        self._results: dict[str, NodeResult] = {}

    def stop(self, reason: str) -> None:
        """Ask every node to stop at its next check; the first reason given wins."""
        with self._lock:
            if self._stop_reason is None:
                self._stop_reason = reason
                self._stop.set_result(None)

    def cancel_reason(self) -> str | None:
        """Why the run must stop (stop(), the cancel Event, Ctrl-C), or None to go on."""
        return self._stop_reason or self._when.reason()

    def publish(self, node: str, signal: str, value: Any) -> None:
        """Wake the dependents waiting on (node, signal) with value; once per signal."""
        with self._lock:
            if (node, signal) in self._published:
                raise DagError(f"node {node!r} published signal {signal!r} twice")
            self._published.add((node, signal))
            future = self._signals.get((node, signal))
            # Done already means the node finished and this is a straggler: ignore it.
            if future is not None and not future.done():
                future.set_result(_Outcome(value=value))
        _log.debug("node %s published %s", node, signal)

    def work(self, node: _Node, inputs: dict[str, Any]) -> None:
        """A ready node's whole life on its worker thread: run it, settle it.

        Every exception is recorded, none escapes: dependents must always wake.
        """
        try:
            started = time.perf_counter()
            with self._lock:
                self._started[node.name] = started
            _log.debug("node %s started", node.name)
            try:
                value = node.fn(NodeContext(node.name, inputs, self))
                result = _settled(node.name, "ok", started, value=value)
            except BaseException as exc:  # a worker thread has no caller: record it
                result = self._stopped(node, started, exc)
        except BaseException as exc:  # only an internal bug gets here
            result = _settled(node.name, "failed", error=exc, reason=failure_reason(exc))
        self._finish(node, result)

    def ready(self, node: _Node) -> dict[str, Any] | NodeResult | None:
        """The node's inputs once every dependency has resolved; its result when it must not
        run (an upstream skip, a stop); None while it still waits."""
        reason = self.cancel_reason()
        if reason is not None:
            return _settled(node.name, "cancelled", reason=reason)
        inputs: dict[str, Any] = {}
        for dep in node.deps:
            future = self._future(dep)
            if not future.done():
                return None
            outcome = future.result()
            if outcome.skip is not None:
                return _settled(node.name, "skipped", reason=outcome.skip)
            inputs[dep.key] = outcome.value
        return inputs

    def _stopped(self, node: _Node, started: float, exc: BaseException) -> NodeResult:
        if isinstance(exc, Cancelled):
            reason = self.cancel_reason() or str(exc) or "cancelled"
            return _settled(node.name, "cancelled", started, error=exc, reason=reason)
        _log.info("node %s failed: %r", node.name, exc)
        return _settled(node.name, "failed", started, error=exc, reason=failure_reason(exc))

    def _future(self, dep: Dep) -> Future[_Outcome]:
        return self._done[dep.node] if dep.signal is None else self._signals[dep.node, dep.signal]

    def _finish(self, node: _Node, result: NodeResult) -> None:
        outcome = _outcome_of(result)
        with self._lock:
            if not self._closed:
                self._results[node.name] = result
            for (owner, signal), future in self._signals.items():
                if owner == node.name and not future.done():
                    if result.status == "ok":
                        skip = f"upstream {node.name} finished without publishing {signal}"
                        future.set_result(_Outcome(skip=skip))
                    else:
                        future.set_result(outcome)
        self._done[node.name].set_result(outcome)
        _log.debug("node %s %s", node.name, result.status)

    def supervise(self, order: list[str], max_workers: int, workers: list[Worker]) -> None:
        """Start each node on a worker once its inputs are ready and a worker is free, until
        every node is done, or until the deadline / cancel Event / Ctrl-C stops the run.

        Stopping only asks: the caller then joins the started workers (see Dag.run); nodes
        never started settle `cancelled` in collect().
        """
        deadline = self._when.deadline
        waiting = [self._nodes[name] for name in order]
        running: list[tuple[_Node, Worker]] = []
        while waiting or running:
            now = time.perf_counter()
            reason = self._when.reason()
            if reason is not None:
                self.stop(reason)
            if self._stop_reason is not None:
                return
            # a node is running until it settles (its thread ends a moment later)
            running = [(n, w) for n, w in running if not self._done[n.name].done()]
            for node in list(waiting):
                inputs = self.ready(node)
                if inputs is None:
                    continue
                if isinstance(inputs, NodeResult):
                    waiting.remove(node)
                    self._finish(node, inputs)
                elif len(running) < max_workers:
                    waiting.remove(node)
                    worker = Worker(f"node-{node.name}", functools.partial(self.work, node, inputs))
                    workers.append(worker)
                    running.append((node, worker))
            pending: list[Future[Any]] = [f for f in self._done.values() if not f.done()]
            pending += [f for f in self._signals.values() if not f.done()]
            if not pending:
                return
            # the cancel Event and the process-wide INTERRUPT cannot be waited on together
            # with futures, so they are polled
            step = _POLL_S if deadline is None else max(0.0, min(deadline - now, _POLL_S))
            wait([*pending, self._stop], timeout=step, return_when=FIRST_COMPLETED)

    def collect(self, order: list[str]) -> DagResult:
        """Freeze the results (every node thread has ended, so every node has settled)."""
        now = time.perf_counter()
        with self._lock:
            self._closed = True
            results: dict[str, NodeResult] = {}
            for name in order:
                result = self._results.get(name)
                if result is None:  # not reachable after the join; kept so collect never lies
                    reason = self._stop_reason or "cancelled"
                    started = self._started.get(name)
                    result = NodeResult(name, "cancelled", None, None, reason, started, now)
                results[name] = result
        return DagResult(results)
