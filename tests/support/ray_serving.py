"""`swarmkv serve --ray-replicas` in tests: the replicas deployed on the test's own local Ray
instance (swarmkv.dist.serve_replicas.ServedReplicas), their actors, and waiting for them."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from swarmkv.dist.affinity import AffinityConfig
from swarmkv.dist.serve_options import APP, ENGINE, IngressOptions, ReplicaSettings
from swarmkv.dist.serve_replicas import ServedReplicas
from swarmkv.serve.runtime import ServeConfig


@contextmanager
def replicas(
    model: Path,
    *,
    n: int = 2,
    routing: str = "prefix",
    n_ctx: int = 2048,
    snapshots: Sequence[Path] = (),
    max_imbalance: int = 4,
) -> Iterator[ServedReplicas]:
    """n replicas of model (1 thread each, chatml template) behind one route on a free
    port, on the Ray instance this process is connected to; taken down at the end."""
    settings = ReplicaSettings(
        n,
        ServeConfig(n_ctx=n_ctx, n_threads=1, max_live=8, snapshots=tuple(snapshots)),
        IngressOptions(model_path=str(model), chat_template="chatml"),
        routing=routing,
        affinity=AffinityConfig(max_imbalance=max_imbalance, max_tokens_per_replica=n_ctx),
        grace_s=5.0,
    )
    served = ServedReplicas(settings, "127.0.0.1", 0)
    try:
        yield served
    finally:
        served.close()


def engine_actor_names() -> list[str]:
    """The engine replicas' actor names (each a replica's full id, the routers' name for
    it), sorted: the order in which the prefix router breaks ties between idle replicas."""
    import ray

    prefix = f"SERVE_REPLICA::{APP}#{ENGINE}#"
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    return sorted(n for n in names if n.startswith(prefix))


def kill_replica(name: str) -> None:
    """Kill an engine replica's process now, as a crash would (Serve starts another)."""
    import ray

    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)


def wait_status(
    served: ServedReplicas, ok: Any, timeout_s: float = 60.0, what: str = "the status"
) -> dict[str, Any]:
    """/v1/status once ok(status) holds (replicas report every second); AssertionError after
    timeout_s, with the last status."""
    deadline = time.monotonic() + timeout_s
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = httpx.get(served.url + "/v1/status", timeout=10).json()
        if ok(status):
            return status
        time.sleep(0.3)
    raise AssertionError(f"{what} not reached in {timeout_s} s: {status}")
