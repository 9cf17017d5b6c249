"""Ctrl-C for a process that runs native code: one process-wide flag, raised only where safe.

Python runs signal handlers in the main thread, between bytecodes, and that can be inside a
cffi callback (llama.cpp logs through one while it loads a model): cffi then prints the
KeyboardInterrupt and drops it, and the program runs on. And a KeyboardInterrupt that unwinds
past code holding native handles frees them under the threads still decoding (a segfault).

So the CLI does its work in a worker thread (`run_interruptibly`) and keeps the main thread
in plain Python, where Ctrl-C always lands. The main thread then sets INTERRUPT; Dag.run
stops every node at its next cancellation check (between decodes), joins them, and raises
Interrupted; long loops call `check()`. The worker unwinds through every `with` and
`finally`, freeing handles in order, and the main thread exits 130.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from .errors import SwarmKVError
from .threads import Worker, wait_all

T = TypeVar("T")

INTERRUPT = threading.Event()


class Interrupted(SwarmKVError):
    """The process was interrupted (Ctrl-C); raised at a safe point after threads stopped."""


def check() -> None:
    """Raise Interrupted if Ctrl-C was pressed; call between steps of long work."""
    if INTERRUPT.is_set():
        raise Interrupted("interrupted")


def run_interruptibly(fn: Callable[[], T]) -> tuple[T | None, bool]:
    """Run fn in a worker thread; return (its result, whether Ctrl-C was pressed).

    A KeyboardInterrupt in the main thread sets INTERRUPT and waits for fn to unwind (a
    second Ctrl-C waits too: the worker is freeing native handles). An exception from fn
    other than Interrupted is re-raised here.
    """
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:
            box["error"] = exc

    wait_all([Worker("main", target)], warn_every_s=float("inf"), on_interrupt=INTERRUPT.set)
    error = box.get("error")
    if isinstance(error, Interrupted) or INTERRUPT.is_set():
        return None, True
    if isinstance(error, BaseException):
        raise error
    return box.get("result"), False  # type: ignore[return-value]
