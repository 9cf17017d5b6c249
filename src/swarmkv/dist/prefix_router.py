"""Ray Serve request routers for the engine replicas (Ray >= 2.47's RequestRouter extension
point, set on the deployment through RequestRouterConfig).

The routers run inside the ingress's process, one per deployment handle, on the handle's
event loop: Serve calls `choose_replicas` for each request (its PendingRequest's first
argument is the EngineCall, whose token ids it reads) and picks the least loaded replica of the
first rank it returns that has room, falling back to the next rank.

| router               | ranks it returns                                              |
|----------------------|---------------------------------------------------------------|
| PrefixAffinityRouter | [affinity.choose's first], [the others]: the longest token    |
|                      | prefix on record, then load, within the imbalance bound       |
| RoundRobinRouter     | [the next replica in id order], blind to prefixes and load:   |
|                      | the baseline that affinity is measured against                |

A call for one replica (EngineCall.replica: i, a warm-up reaching every replica) goes to the
i-th live replica in id order, whichever router runs, and the prefix router records its
tokens there (`pinned_replica`).

The load a replica is weighed by is Serve's count of its ongoing requests plus the requests
this router chose it for that Serve has not placed yet (claims.py): without them every request
of a burst reads the same stale counts and goes to the same replica.

A replica that dies is dropped from the record as soon as Serve says so
(`on_replica_actor_died`, or a replica update without it); its prefixes then go wherever
affinity.choose sends new ones. Each router also registers itself (router_stats.py), so that
the ingress can read its replicas' routing stats (their engines' status) for /v1/status.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from .affinity import AffinityConfig, choose
from .claims import Claims
from .prefix_record import PrefixRecord
from .router_stats import register

log = logging.getLogger("swarmkv.dist.router")


def request_tokens(pending: PendingRequest | None) -> Sequence[int] | None:
    """The token ids of the request Serve is routing (its EngineCall's), or None for a call
    without any (an info or status call)."""
    if pending is None or not pending.args:
        return None
    tokens = getattr(pending.args[0], "tokens", None)
    return tokens if tokens else None


def _name(replica_id: ReplicaID) -> str:
    return replica_id.to_full_id_str()


def _request_id(pending: PendingRequest | None) -> str | None:
    return pending.metadata.internal_request_id if pending is not None else None


def pinned_replica(
    candidates: list[RunningReplica], pending: PendingRequest | None
) -> RunningReplica | None:
    """The replica a call names (its EngineCall.replica: an index into the live replicas in
    id order, modulo their number, so that a warm-up still reaches the live ones while one is
    being replaced), or None when it names none."""
    index = getattr(pending.args[0], "replica", None) if pending and pending.args else None
    if index is None or not candidates:
        return None
    ordered = sorted(candidates, key=lambda r: _name(r.replica_id))
    return ordered[index % len(ordered)]


class PrefixAffinityRouter(RequestRouter):
    """Routes by the longest token prefix on record, then load (see affinity.py)."""

    def initialize_state(self, **kwargs: Any) -> None:
        """kwargs: AffinityConfig's fields (RequestRouterConfig.request_router_kwargs)."""
        self.config = AffinityConfig(**kwargs)
        self.config.check()
        self.record = PrefixRecord(self.config.max_tokens_per_replica)
        self.claims = Claims()
        register(self._deployment_id.name, self)

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        tokens = request_tokens(pending_request)
        pinned = pinned_replica(candidate_replicas, pending_request)
        if pinned is not None:
            self._chose(pending_request, _name(pinned.replica_id), tokens)
            return [[pinned]]
        by_name = {_name(r.replica_id): r for r in candidate_replicas}
        loads = await self._loads(candidate_replicas)
        if not loads:  # no replica answered for its queue length: Serve probes again
            return [candidate_replicas]
        # from here to the claim nothing awaits: the next choice of a burst sees this one
        for replica, n in self.claims.counts(time.monotonic()).items():
            if replica in loads:
                loads[replica] += n
        matches = self.record.match(tokens) if tokens else {}
        order = choose(loads, matches, self.record.sizes, self.config)
        self._chose(pending_request, order[0], tokens)
        ranks = [[by_name[order[0]]]]
        if len(order) > 1:
            ranks.append([by_name[r] for r in order[1:]])
        return ranks

    def _chose(
        self, pending: PendingRequest | None, replica: str, tokens: Sequence[int] | None
    ) -> None:
        """Recorded and claimed now, not when the replica accepts: the next request of a
        burst must already find this one's prefix here, and its load (claims.py)."""
        if tokens:
            self.record.insert(replica, tokens)
        request = _request_id(pending)
        if request is not None:
            self.claims.claim(request, replica, time.monotonic())

    async def _loads(self, replicas: list[RunningReplica]) -> dict[str, int]:
        """Ongoing requests per replica: Serve's cached queue lengths, probed where missing
        (a replica that does not answer is left out)."""
        cache = self.replica_queue_len_cache
        loads: dict[str, int] = {}
        missing = []
        for r in replicas:
            n = cache.get(r.replica_id)
            if n is None:
                missing.append(r)
            else:
                loads[_name(r.replica_id)] = n
        if missing:
            for r, n in await self._probe_queue_lens(missing, 0):
                if n is not None:
                    loads[_name(r.replica_id)] = n
        return loads

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any
    ) -> None:
        """The replica accepted the request: on record there (it may not be the first choice,
        when that one was full), and in Serve's queue lengths from now on (no longer a claim)."""
        tokens = request_tokens(pending_request)
        if tokens:
            self.record.insert(_name(replica_id), tokens)
        request = _request_id(pending_request)
        if request is not None:
            self.claims.placed(request)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.record.drop(_name(replica_id))
        self.claims.drop_replica(_name(replica_id))
        log.warning("replica %s died: its prefixes are forgotten", _name(replica_id))

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        alive = {_name(r.replica_id) for r in replicas}
        for gone in set(self.record.replicas) - alive:
            self.record.drop(gone)
            self.claims.drop_replica(gone)


class RoundRobinRouter(RequestRouter):
    """Each request to the next replica in id order, whatever its prefix or their load."""

    def initialize_state(self, **kwargs: Any) -> None:
        self._turn = 0
        register(self._deployment_id.name, self)

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        pinned = pinned_replica(candidate_replicas, pending_request)
        if pinned is not None:
            return [[pinned]]
        ordered = sorted(candidate_replicas, key=lambda r: _name(r.replica_id))
        if not ordered:
            return []
        pick = ordered[self._turn % len(ordered)]
        self._turn += 1
        return [[pick]]


ROUTERS = {"prefix": PrefixAffinityRouter, "round-robin": RoundRobinRouter}
