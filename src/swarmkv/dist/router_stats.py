"""Where the ingress finds its replicas' engine status: each request router registers itself
here, by deployment name, when Serve makes it in the ingress's process.

A module of its own because Serve pickles a request router's module by value (its globals
are copied), so a registry there would be a copy; this module is imported by reference, so
the router and the ingress share it.
"""

from __future__ import annotations

from typing import Any

_ROUTERS: dict[str, Any] = {}  # deployment name -> the RequestRouter of this process's handle


def register(deployment: str, router: Any) -> None:
    """router routes this process's requests to deployment's replicas from now on."""
    _ROUTERS[deployment] = router


def replica_stats(deployment: str) -> list[dict[str, Any]]:
    """The routing stats (each engine's status) of the replicas this process's router of
    deployment routes to now; empty before its first request made the router."""
    router = _ROUTERS.get(deployment)
    if router is None:
        return []
    replicas = list(router.curr_replicas.values())
    return [dict(r.routing_stats) for r in replicas if r.routing_stats]


def replica_count(deployment: str) -> int:
    """How many replicas of deployment this process's router routes to now (0 before it
    exists)."""
    router = _ROUTERS.get(deployment)
    return 0 if router is None else len(router.curr_replicas)
