"""`swarmkv serve`: the OpenAI-compatible server (the `[serve]` extra).

    swarmkv serve [-m MODEL] [--host 127.0.0.1] [--port 8000] [-t N] [-c CTX] [--max-live N]
                  [--policy fair|fifo|priority] [--api-key KEY ...] [--snapshot FILE ...]
                  [--prefix-scope global|key] [--chat-template NAME] [--no-exact]
                  [--ray-replicas N [--address ADDR] [--routing prefix|round-robin]
                   [--max-imbalance N]]

SIGTERM or Ctrl-C: stop accepting, let in-flight requests finish within --grace seconds
(then cancel them), free everything, exit 0. With --ray-replicas (the `[dist]` extra), N
engines run as Ray Serve replicas behind the same routes (swarmkv.dist.serve_replicas).
"""

from __future__ import annotations

import argparse
import logging
import signal
from pathlib import Path
from typing import Any

from ..errors import ConfigError

log = logging.getLogger("swarmkv.serve")


def add_parser(subs: Any) -> None:
    """Register `swarmkv serve` on the CLI's subparsers."""
    p = subs.add_parser(
        "serve",
        allow_abbrev=False,
        help="an OpenAI-compatible HTTP server with automatic prefix reuse",
        description="Serve /v1/completions and /v1/chat/completions from one engine: every "
        "request reuses the longest prefix already in the KV cache (zero copy), and with "
        "batch-invariant kernels (the default) answers exactly as it would alone.",
    )
    p.add_argument("-m", "--model", help="GGUF file (default: the bundled Gemma 3 270M)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free)")
    p.add_argument("-t", "--threads", type=int, default=None, help="decode threads")
    p.add_argument("-c", "--ctx-size", type=int, default=8192, help="KV cells (default 8192)")
    p.add_argument("-b", "--batch-size", type=int, default=512, help="rows per decode")
    p.add_argument("--max-live", type=int, default=16, help="requests decoding at once")
    p.add_argument(
        "--max-cached",
        type=int,
        default=64,
        help="finished requests kept resident for prefix reuse (LRU)",
    )
    p.add_argument(
        "--max-queue", type=int, default=256, help="requests waiting before new ones get 429"
    )
    p.add_argument("--policy", choices=("fair", "fifo", "priority"), default="fair")
    p.add_argument(
        "--api-key",
        action="append",
        default=[],
        metavar="KEY",
        help="require this key (Authorization: Bearer KEY); repeat for several",
    )
    p.add_argument(
        "--snapshot",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="a .swkv prefix to keep resident (pinned, never evicted); repeatable",
    )
    p.add_argument(
        "--prefix-scope",
        choices=("global", "key"),
        default="global",
        help="global: any request reuses any prefix (one user); key: only within "
        "one API key, so no tenant can time another's prompts",
    )
    p.add_argument(
        "--chat-template",
        default=None,
        metavar="NAME",
        help="a llama.cpp built-in chat template (default: the GGUF's, else the architecture's)",
    )
    p.add_argument("--max-body", type=int, default=8 << 20, help="request body limit, bytes")
    p.add_argument(
        "--grace",
        type=float,
        default=30.0,
        help="seconds in-flight requests get to finish on SIGTERM/Ctrl-C",
    )
    p.add_argument(
        "--exact",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="batch-invariant kernels (the default wherever every backend has them, the CPU's: "
        "answers as alone); --no-exact: llama.cpp's fastest kernels, answers then depend on "
        "the batch; --exact insists (refused on a GPU)",
    )
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning"))
    _add_ray_flags(p)
    p.set_defaults(func=run)


def _add_ray_flags(p: argparse.ArgumentParser) -> None:
    ray = p.add_argument_group("Ray Serve replicas (the [dist] extra)")
    ray.add_argument(
        "--ray-replicas",
        type=int,
        default=None,
        metavar="N",
        help="run N engines as Ray Serve replicas behind this one route, each request sent to "
        "the replica that holds the longest prefix of its tokens",
    )
    ray.add_argument(
        "--address",
        default=None,
        metavar="ADDR",
        help="the Ray cluster to join (auto, ray://host:10001; default: a local instance)",
    )
    ray.add_argument(
        "--routing",
        choices=("prefix", "round-robin"),
        default=None,
        help="prefix: by token-prefix affinity, then load (default); round-robin: the baseline",
    )
    ray.add_argument(
        "--max-imbalance",
        type=int,
        default=None,
        metavar="N",
        help="send a request to the least loaded replica instead of its prefix's when that "
        "one has more than N requests more (default 4)",
    )


def _check_args(args: argparse.Namespace) -> None:
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be in [0, 65535], got {args.port}")
    if args.grace < 0:
        raise ConfigError(f"--grace must be >= 0, got {args.grace}")
    if args.prefix_scope == "key" and not args.api_key:
        raise ConfigError("--prefix-scope key needs at least one --api-key")
    for key in args.api_key:
        if len(key) < 8 or not key.isprintable():
            raise ConfigError("an --api-key must be at least 8 printable characters")
    for snap in args.snapshot:
        if not snap.is_file():
            raise ConfigError(f"--snapshot {snap}: no such file")
    _check_ray_args(args)


def _check_ray_args(args: argparse.Namespace) -> None:
    if args.ray_replicas is None:
        for flag, value in (
            ("--address", args.address),
            ("--routing", args.routing),
            ("--max-imbalance", args.max_imbalance),
        ):
            if value is not None:
                raise ConfigError(f"{flag} needs --ray-replicas")
        return
    if args.ray_replicas < 1:
        raise ConfigError(f"--ray-replicas must be >= 1, got {args.ray_replicas}")
    if args.max_imbalance is not None and args.max_imbalance < 0:
        raise ConfigError(f"--max-imbalance must be >= 0, got {args.max_imbalance}")


def run(args: argparse.Namespace) -> int:
    """Load, serve until SIGTERM/Ctrl-C, drain, free. Exit status 0 after a clean stop."""
    _check_args(args)  # before any import of the extras: bad flags say so, whatever is installed
    try:
        import uvicorn

        from ..serve.http.app import create_app
    except ImportError as exc:
        raise ConfigError(
            f"swarmkv serve needs the [serve] extra: pip install '.[serve]' ({exc})"
        ) from exc
    from ..serve.http.boot import boot, serve_config

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if args.ray_replicas is not None:
        return _run_on_ray(args, serve_config(args))
    runtime, settings = boot(args)
    try:
        app = create_app(runtime, settings)
        config = uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            timeout_graceful_shutdown=args.grace,
            lifespan="off",
        )
        server = uvicorn.Server(config)
        _mark_draining_on_signal(server, runtime)
        log.info(
            "model %s, chat template %s, fingerprint %s",
            settings.model_id,
            settings.chat_template.name if settings.chat_template else "none",
            settings.fingerprint,
        )
        _quiet_reraise()
        server.run()
    finally:
        runtime.close()
        runtime.model.close()
    return 0


def _run_on_ray(args: argparse.Namespace, config: Any) -> int:
    """The replicas on Ray Serve (config: the engines' ServeConfig, checked already)."""
    from ..dist.fanout import import_ray

    import_ray()  # ConfigError naming the [dist] extra when ray is missing
    try:
        from ..dist.serve_replicas import run_replicas
    except ImportError as exc:  # ray without its serve extra
        raise ConfigError(f"--ray-replicas needs Ray Serve: pip install '.[dist]' ({exc})") from exc
    return run_replicas(args, config)


def _mark_draining_on_signal(server: Any, runtime: Any) -> None:
    """uvicorn's stop-signal handler, which also marks the runtime as draining as soon as
    the signal lands (so /health says so and new requests get 503). uvicorn installs
    `server.handle_exit` when it starts serving, so wrapping the instance's is enough."""
    handle = server.handle_exit

    def on_signal(sig: int, frame: Any) -> None:
        runtime.stop_accepting()
        handle(sig, frame)

    server.handle_exit = on_signal


def _quiet_reraise() -> None:
    """uvicorn re-raises the stop signal once it has shut down; with these handlers that
    re-raise is a no-op, so a clean stop exits 0 instead of dying of SIGTERM."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
