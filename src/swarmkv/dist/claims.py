"""Requests the prefix router has chosen a replica for and Serve has not yet placed: the load
that Serve's queue lengths do not show yet. Plain Python (prefix_router.py owns one).

Serve counts a request against a replica once it is sent there (and the replica's answer
corrects the count), but a burst's requests are chosen before any of them is sent: every
choice then reads the same stale lengths and sends the whole burst to one replica. Each
choice is therefore claimed here, at once, and counted as load until Serve says where the
request went (`placed`); a claim Serve never confirms (a request cancelled while it was being
routed) lapses after `ttl_s`.
"""

from __future__ import annotations

from collections import Counter


class Claims:
    """request id -> (replica, when claimed), counted as load until placed or lapsed."""

    def __init__(self, ttl_s: float = 10.0) -> None:
        self.ttl_s = ttl_s
        self._by_request: dict[str, tuple[str, float]] = {}

    def claim(self, request: str, replica: str, now: float) -> None:
        """The router chose replica for request (again: the newer choice replaces the older)."""
        self._by_request[request] = (replica, now)

    def placed(self, request: str) -> None:
        """Serve sent request to a replica that accepted it: Serve's own count has it now."""
        self._by_request.pop(request, None)

    def drop_replica(self, replica: str) -> None:
        """replica is gone: its claims with it."""
        for request in [q for q, (r, _) in self._by_request.items() if r == replica]:
            del self._by_request[request]

    def counts(self, now: float) -> Counter[str]:
        """Claims per replica, the lapsed ones dropped first."""
        lapsed = [q for q, (_, t) in self._by_request.items() if now - t > self.ttl_s]
        for request in lapsed:
            del self._by_request[request]
        return Counter(r for r, _ in self._by_request.values())
