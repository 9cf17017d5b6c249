"""Worker threads that are always waited for: the one way SwarmKV starts and joins threads.

Waiting uses an Event each worker sets as its very last act, never Thread.join: a
KeyboardInterrupt that lands inside join() can leave a thread marked stopped while it still
runs (CPython gh-90882), and code that frees native handles after the wait would then free
them under a running decode.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

_log = logging.getLogger("swarmkv.process.threads")

# Waits wake this often, so a KeyboardInterrupt reaches the main thread while it waits.
SLICE_S = 0.1


class Worker:
    """Runs fn on a daemon thread named `swarmkv-<name>`; `done` is set when fn returns or
    raises (fn handles its own exceptions: an escaping one is logged)."""

    def __init__(self, name: str, fn: Callable[[], None]) -> None:
        self.name = name
        self.done = threading.Event()

        def body() -> None:
            try:
                fn()
            except BaseException:
                _log.exception("worker %s raised", name)
            finally:
                self.done.set()

        threading.Thread(target=body, name=f"swarmkv-{name}", daemon=True).start()


def wait_all(
    workers: list[Worker],
    warn_every_s: float = 5.0,
    on_interrupt: Callable[[], None] | None = None,
) -> bool:
    """Wait until every worker is done, whatever arrives meanwhile.

    A KeyboardInterrupt does not end the wait (the workers may hold native handles): it
    calls on_interrupt (to ask them to stop) and is reported by returning True. Every
    warn_every_s seconds a warning names the workers still running.
    """
    interrupted = False
    waited = 0.0
    while True:
        alive = [w for w in workers if not w.done.is_set()]
        if not alive:
            return interrupted
        try:
            alive[0].done.wait(SLICE_S)
        except KeyboardInterrupt:
            interrupted = True
            if on_interrupt is not None:
                on_interrupt()
            _log.warning("interrupted: waiting for %d worker(s) to stop first", len(alive))
        waited += SLICE_S
        if waited >= warn_every_s:
            waited = 0.0
            _log.warning("still waiting for: %s", ", ".join(w.name for w in alive))
