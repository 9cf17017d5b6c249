"""From `swarmkv serve`'s flags to a running runtime and the app's settings."""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from ..._native import BUILD, LLAMA_CPP_COMMIT
from ...errors import ConfigError
from ...llama.chat import ChatTemplate
from ...llama.exactness import resolve_exact
from ...llama.model import Model
from ...llama.models import default_model_path
from ..runtime import Runtime, ServeConfig
from .app import Settings


def fingerprint(model: Model, exact: bool) -> str:
    """What makes answers reproducible: the weights, the llama.cpp commit, the patches and
    the kernels. `fp-<hash>-exact` promises batch-invariant answers; `-plain` does not."""
    facts = {
        "model": model.fingerprint,
        "llama.cpp": LLAMA_CPP_COMMIT,
        "patches": BUILD.get("patches", []),
        "exact": exact,
    }
    digest = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]
    return f"fp-{digest}-{'exact' if exact else 'plain'}"


def serve_config(args: argparse.Namespace) -> ServeConfig:
    """The engine's settings from `swarmkv serve`'s flags, checked (ConfigError)."""
    config = ServeConfig(
        n_ctx=args.ctx_size,
        n_batch=args.batch_size,
        n_threads=args.threads,
        max_live=args.max_live,
        max_cached=args.max_cached,
        max_queue=args.max_queue,
        policy=args.policy,
        exact=resolve_exact(args.exact).exact,  # --exact/--no-exact, else where supported
        snapshots=tuple(args.snapshot),
    )
    config.check()
    return config


def boot(args: argparse.Namespace) -> tuple[Runtime, Settings]:
    """Load the model, start the runtime (snapshots pinned), and the app's settings."""
    config = serve_config(args)
    path = Path(args.model).expanduser() if args.model else default_model_path()
    model = Model(path, repack=not config.exact)
    try:
        template = chat_template(model, args.chat_template)
        runtime = Runtime(model, config)
    except BaseException:
        model.close()
        raise
    settings = Settings(
        model_id=path.stem,
        fingerprint=fingerprint(model, config.exact),
        chat_template=template,
        api_keys=tuple(args.api_key),
        prefix_scope=args.prefix_scope,
        max_body_bytes=args.max_body,
    )
    return runtime, settings


def chat_template(model: Model, name: str | None) -> ChatTemplate | None:
    """The chat template, or None (no chat endpoint) for a model that has none when no
    name was given; a name llama.cpp does not know is a ConfigError."""
    try:
        return ChatTemplate.for_model(model, name)
    except ConfigError:
        if name is not None:
            raise
        return None
