"""The settings of `swarmkv serve --ray-replicas` (plain data, no Ray: serve_replicas.py
deploys them; the engine and ingress deployments receive their parts pickled)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import ConfigError
from ..serve.runtime import ServeConfig
from .affinity import ROUTINGS, AffinityConfig
from .fanout import _model_for_workers

APP = "swarmkv"  # the Serve application
ENGINE = "SwarmKVEngine"  # its deployments
INGRESS = "SwarmKVIngress"


@dataclass(frozen=True)
class IngressOptions:
    """The HTTP side's flags, and which deployment holds the engines."""

    engine: str = ENGINE  # the engine deployment: its router's key (prefix_router.replica_stats)
    model_path: str | None = None  # None: the default model, found on the ingress's node
    chat_template: str | None = None
    api_keys: tuple[str, ...] = ()
    prefix_scope: str = "global"
    max_body_bytes: int = 8 << 20
    replicas: int = 1  # the engine replicas deployed (ReplicaSettings.replicas: build_app)


@dataclass(frozen=True)
class ReplicaSettings:
    """Everything the deployments need (from `swarmkv serve`'s flags: settings_from_args)."""

    replicas: int
    config: ServeConfig
    ingress: IngressOptions = field(default_factory=IngressOptions)
    routing: str = "prefix"  # or "round-robin" (prefix_router.ROUTERS)
    affinity: AffinityConfig = field(default_factory=AffinityConfig)
    grace_s: float = 30.0
    log_level: str = "warning"

    def check(self) -> None:
        """ConfigError naming the first bad setting, before Ray starts."""
        if self.replicas < 1:
            raise ConfigError(f"--ray-replicas must be >= 1, got {self.replicas}")
        if self.routing not in ROUTINGS:
            raise ConfigError(f"routing must be one of {', '.join(ROUTINGS)}, got {self.routing!r}")
        self.config.check()
        self.affinity.check()


def settings_from_args(args: argparse.Namespace, config: ServeConfig) -> ReplicaSettings:
    """The settings of `swarmkv serve --ray-replicas` (config: serve_config(args), checked).
    On a local instance the replicas share this machine's CPUs out unless -t says otherwise."""
    threads = config.n_threads
    if threads is None and args.address is None:
        threads = max(1, (os.cpu_count() or 1) // args.ray_replicas)
    config = replace(config, n_threads=threads)
    ingress = IngressOptions(
        model_path=_model_for_workers(Path(args.model).expanduser() if args.model else None),
        chat_template=args.chat_template,
        api_keys=tuple(args.api_key),
        prefix_scope=args.prefix_scope,
        max_body_bytes=args.max_body,
    )
    affinity = AffinityConfig(
        max_imbalance=4 if args.max_imbalance is None else args.max_imbalance,
        max_tokens_per_replica=config.n_ctx,  # what one engine's cache can hold at most
    )
    settings = ReplicaSettings(
        args.ray_replicas,
        config,
        ingress,
        routing=args.routing or "prefix",
        affinity=affinity,
        grace_s=args.grace,
        log_level=args.log_level,
    )
    settings.check()
    return settings
