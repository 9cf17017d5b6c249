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
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import SwarmKVError

INTERRUPT = threading.Event()


class Interrupted(SwarmKVError):
    """The process was interrupted (Ctrl-C); raised at a safe point after threads stopped."""


def check() -> None:
    """Raise Interrupted if Ctrl-C was pressed; call between steps of long work."""
    if INTERRUPT.is_set():
        raise Interrupted("interrupted")


@contextmanager
def ctrl_c_sets_flag() -> Iterator[None]:
    """While active, SIGINT (Ctrl-C) sets INTERRUPT instead of raising KeyboardInterrupt.

    Every further Ctrl-C only sets it again: the work is freeing native handles and must
    finish. The previous handler comes back on exit. Signal handlers can only be set from the
    main thread; elsewhere this does nothing (Ctrl-C keeps Python's default behaviour).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, lambda _signum, _frame: INTERRUPT.set())
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
