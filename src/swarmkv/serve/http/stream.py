"""From the engine thread to a request's event loop, and text that never shows a stop string.

`Choice` is one submitted job seen from asyncio: the engine thread's events hop onto the
loop (call_soon_threadsafe) into a queue the handler reads. `StopBuffer` holds back the
tail of a streamed answer that could still begin a stop string, so a client never receives
text the final answer cuts off.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

from ..job import DoneEvent, ErrorEvent, Event, TokenEvent


class Choice:
    """One completion choice's events, readable on the loop that made it."""

    def __init__(self, index: int, loop: asyncio.AbstractEventLoop) -> None:
        self.index = index
        self.loop = loop
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.ended = False

    def push(self, event: Event) -> None:
        """Called on the engine thread."""
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody reads any more
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)

    async def stream(self) -> AsyncIterator[Event]:
        """Each event until (and including) the DoneEvent or ErrorEvent."""
        while True:
            event = await self.events.get()
            yield event
            if isinstance(event, DoneEvent | ErrorEvent):
                self.ended = True
                return


class StopBuffer:
    """Streamed text with stop strings held back (see the module docstring)."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.sent = ""
        self._held = ""
        self._stopped = False

    def feed(self, text: str) -> str:
        """The part of text (after what was held) that is safe to send now."""
        if self._stopped:
            return ""
        held = self._held + text
        # what was sent never ends in a stop's prefix (that is held), so a stop cannot
        # straddle the two: held alone says whether one has appeared
        if any(s in held for s in self.stops):
            self._held, self._stopped = held, True
            return ""
        keep = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(held)), keep, -1):
                if held.endswith(s[:k]):
                    keep = k
                    break
        out, self._held = held[: len(held) - keep], held[len(held) - keep :]
        self.sent += out
        return out

    def finish(self, final: str) -> str:
        """What is left to send of the final answer (cut at its stop string)."""
        rest = final[len(self.sent) :] if final.startswith(self.sent) else ""
        self.sent += rest
        return rest


def collect_tokens(events: list[Event]) -> tuple[list[TokenEvent], DoneEvent]:
    """A finished choice's token events and its DoneEvent; raises its error."""
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    end = events[-1]
    if isinstance(end, ErrorEvent):
        raise end.error
    assert isinstance(end, DoneEvent)
    return tokens, end
