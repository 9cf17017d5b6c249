"""Ctrl-C for a process that runs native code: one process-wide flag, raised only where safe.

Python runs signal handlers in the main thread, between bytecodes, and that can be inside a
cffi callback (llama.cpp logs through one while it loads a model): a KeyboardInterrupt raised
there is printed and dropped by cffi, and the program runs on. And a KeyboardInterrupt that
unwinds past code holding native handles frees them under the threads still decoding (a
segfault).

So the CLI runs its command under `ctrl_c_sets_flag()`: Ctrl-C then only sets INTERRUPT,
which never raises anywhere. Dag.run (waiting in the main thread) sees the flag, stops every
node at its next cancellation check (between decodes), joins them and raises Interrupted;
long loops call `check()`. The command unwinds through every `with` and `finally`, freeing
handles in order, and the CLI exits 130.

The flag belongs to the guarded work it interrupted: only the guard's handler sets it, and
the outermost guard clears it when it ends (its `interrupted` says whether Ctrl-C came). So in
a long-lived process (a notebook, a server) one Ctrl-C stops one run, not every later one.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType

from ..errors import SwarmKVError

INTERRUPT = threading.Event()


class Interrupted(SwarmKVError):
    """The process was interrupted (Ctrl-C); raised at a safe point after threads stopped."""


@dataclass
class CtrlC:
    """What a ctrl_c_sets_flag() guard saw; `interrupted` is set when the guard ends."""

    interrupted: bool = False


def check() -> None:
    """Raise Interrupted if Ctrl-C was pressed; call between steps of long work."""
    if INTERRUPT.is_set():
        raise Interrupted("interrupted")


def _set_flag(_signum: int, _frame: FrameType | None) -> None:
    INTERRUPT.set()


@contextmanager
def ctrl_c_sets_flag() -> Iterator[CtrlC]:
    """While active, SIGINT (Ctrl-C) sets INTERRUPT instead of raising KeyboardInterrupt.

    Every further Ctrl-C only sets it again: the work is freeing native handles and must
    finish. On exit the previous handler comes back, the yielded CtrlC's `interrupted` tells
    whether the flag was set, and the outermost guard clears the flag (a guard inside another
    leaves it to the outer one, whose work must stop too). Signal handlers can only be set
    from the main thread; elsewhere this only reports the flag, and Ctrl-C keeps Python's
    default behaviour.
    """
    state = CtrlC()
    if threading.current_thread() is not threading.main_thread():
        try:
            yield state
        finally:
            state.interrupted = INTERRUPT.is_set()
        return
    previous = signal.signal(signal.SIGINT, _set_flag)
    try:
        yield state
    finally:
        signal.signal(signal.SIGINT, previous)
        state.interrupted = INTERRUPT.is_set()
        if previous is not _set_flag:  # the outermost guard: the interrupted work is over
            INTERRUPT.clear()
