"""`swarmkv serve --ray-replicas N`: N engines as Ray Serve replicas behind one OpenAI route.

    served = ServedReplicas(settings, host="127.0.0.1", port=8000)   # ray.init if needed
    ...                                                              # http://127.0.0.1:8000/v1
    served.close()

| deployment     | replicas | Ray CPUs | what                                               |
|----------------|----------|----------|----------------------------------------------------|
| SwarmKVIngress | 1        | 0        | serve_ingress.Ingress: the FastAPI app, tokenizer  |
| SwarmKVEngine  | N        | threads  | serve_engine.EngineReplica: a Runtime each         |

The engine deployment's RequestRouterConfig names prefix_router's router (prefix affinity by
default); the ingress's handle to it routes every request through it. Snapshot files are read
here once, each put into the object store (payload.py: a zero-copy view of the file's
mapping), and every replica, a restarted one too, restores them from there: the refs live as
long as this object, and no replica reads a path.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..serve.runtime import ServeConfig
from .fanout import import_ray
from .serve_options import APP, ENGINE, INGRESS, ReplicaSettings, settings_from_args

log = logging.getLogger("swarmkv.dist.serve")

STATS_PERIOD_S = 1.0  # how often each replica's status reaches the ingress (/v1/status)
SHUTDOWN_POLL_S = 0.2  # how often a stopping replica looks whether its requests have ended


def build_app(settings: ReplicaSettings, snapshot_refs: list[Any]) -> Any:
    """The Serve application: the ingress bound to the engine deployment."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from .prefix_router import ROUTERS
    from .serve_engine import EngineReplica
    from .serve_ingress import Ingress

    s, config = settings, settings.config
    router_options: dict[str, Any] = {
        "request_router_class": ROUTERS[s.routing],
        "request_router_kwargs": asdict(s.affinity) if s.routing == "prefix" else {},
        "request_routing_stats_period_s": STATS_PERIOD_S,
    }
    router = RequestRouterConfig(**router_options)
    deployment: Any = serve.deployment  # its overloads hide Deployment.options from mypy
    logs = {"log_level": s.log_level.upper(), "enable_access_log": False}
    # one more than an engine queues: Serve never holds a request back, so a full engine's
    # own 429 answers it, as the single server does
    per_engine = config.max_live + config.max_queue + 1
    engine = deployment(EngineReplica).options(
        name=ENGINE,
        num_replicas=s.replicas,
        max_ongoing_requests=per_engine,
        ray_actor_options={"num_cpus": config.n_threads or 1},
        request_router_config=router,
        graceful_shutdown_timeout_s=s.grace_s,
        graceful_shutdown_wait_loop_s=SHUTDOWN_POLL_S,
        logging_config=logs,
    )
    ingress = deployment(Ingress).options(
        name=INGRESS,
        num_replicas=1,  # one router, so one record of which prefixes went where
        max_ongoing_requests=per_engine * s.replicas,
        ray_actor_options={"num_cpus": 0},  # it tokenizes; the engines hold the CPUs
        graceful_shutdown_timeout_s=s.grace_s,
        graceful_shutdown_wait_loop_s=SHUTDOWN_POLL_S,
        logging_config=logs,
    )
    model_path = s.ingress.model_path
    options = replace(s.ingress, replicas=s.replicas)
    return ingress.bind(engine.bind(model_path, config, snapshot_refs), config, options)


class ServedReplicas:
    """The app deployed and serving (see the module docstring); close() takes it down, and
    Serve and Ray with it where this object started them.

    address: a Ray cluster to join ("auto", "ray://host:10001"); None joins the instance this
    process is connected to, or starts a local one (CPUs: replicas x threads, at least this
    machine's). connected: called once Ray is up, before the deployment (which takes seconds):
    the command installs its signal handlers there, over the one ray.init sets."""

    def __init__(
        self,
        settings: ReplicaSettings,
        host: str,
        port: int,
        address: str | None = None,
        connected: Callable[[], None] | None = None,
    ) -> None:
        settings.check()
        ray = import_ray()
        self._started_ray = self._started_serve = False
        self._refs: list[Any] = []
        if not ray.is_initialized():
            threads = settings.config.n_threads or 1
            cpus = (
                max(settings.replicas * threads, os.cpu_count() or 1) if address is None else None
            )
            try:
                ray.init(address=address, num_cpus=cpus, include_dashboard=False)
            except (ConnectionError, ValueError, RuntimeError) as exc:
                where = (
                    "a local Ray instance" if address is None else f"the Ray cluster at {address!r}"
                )
                raise ConfigError(f"could not start or reach {where}: {exc}") from None
            self._started_ray = True
        try:
            if connected is not None:
                connected()
            self._deploy(settings, host, port or _free_port(host))
        except BaseException:
            self.close()
            raise

    def _deploy(self, settings: ReplicaSettings, host: str, port: int) -> None:
        from ray import serve

        self._refs = [_put_snapshot(p) for p in settings.config.snapshots]
        self._started_serve = not _serve_running()
        if self._started_serve:
            logs = {"log_level": settings.log_level.upper(), "enable_access_log": False}
            serve.start(http_options={"host": host, "port": port}, logging_config=logs)
        else:
            log.warning("Serve already runs on this cluster: its proxy keeps its own address")
        try:
            serve.run(build_app(settings, self._refs), name=APP, route_prefix="/")
        except RuntimeError as exc:  # a replica's constructor failed (Serve tried again)
            raise ConfigError(f"the replicas did not start: {_why_not(exc)}") from None
        shown = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host  # every interface
        self.url = f"http://{shown}:{port}"

    def close(self) -> None:
        """Take the app down (in-flight requests get the grace period), then Serve and Ray
        where this object started them. Idempotent."""
        ray = import_ray()
        if ray.is_initialized():
            from ray import serve

            if self._started_serve:
                serve.shutdown()
            elif _serve_running():
                serve.delete(APP)
        self._started_serve, self._refs = False, []
        if self._started_ray:
            self._started_ray = False
            ray.shutdown()


def run_replicas(args: argparse.Namespace, config: ServeConfig) -> int:
    """`swarmkv serve --ray-replicas`: deploy, serve until SIGTERM or Ctrl-C, take it down."""
    settings = settings_from_args(args, config)
    stop = threading.Event()

    def on_stop_signals() -> None:  # a signal while the replicas start stops them once up
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())

    served = ServedReplicas(settings, args.host, args.port, args.address, on_stop_signals)
    try:
        log.info(
            "%d replicas (%s routing) serving on %s/v1",
            settings.replicas,
            settings.routing,
            served.url,
        )
        while not stop.wait(0.5):  # a timed wait: the handler runs promptly in this thread
            pass
    finally:
        served.close()
    return 0


def _why_not(exc: RuntimeError) -> str:
    """The error a deployment's constructor raised, in one line (Serve's message ends with
    its traceback), else exc's own message."""
    from ray import serve

    try:
        deployments = serve.status().applications[APP].deployments.values()
    except Exception:  # the status is unavailable: exc says what Serve knows
        return str(exc)
    for d in deployments:
        lines = [ln.strip() for ln in (d.message or "").splitlines() if ln.strip()]
        if lines and "Traceback" in d.message:
            return lines[-1]
    return str(exc)


def _put_snapshot(path: Path) -> Any:
    """path's snapshot in the object store, read once (the put copies it from the mapping)."""
    from ..kv.snapshot import KVSnapshot
    from .payload import snapshot_payload

    ray = import_ray()
    snap = KVSnapshot.open_shared(path)
    try:
        return ray.put(snapshot_payload(snap))
    finally:
        snap.release()


def _serve_running() -> bool:
    """Whether Serve's controller runs on the cluster already (then its HTTP options stay)."""
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    ray = import_ray()
    try:
        ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    except ValueError:
        return False
    return True


def _free_port(host: str) -> int:
    """A port free now on host (`--port 0`: Serve's proxy needs a number)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
