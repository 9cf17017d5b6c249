"""SwarmKV: prefill a shared document once, fan its KV state out to many LLM branches.

The package is layered, one folder per layer, each importing only the layers below it (an
import-linter contract in pyproject.toml checks this):

    cli/                 one module per command, and output formatting
    swarm/, dist/        the long-lived scheduler service; Ray across machines
    pipeline/            spec, TOML, DAG, the handoff modes, results
    engine/              sequences, scheduling policies, the step loop, snapshot creation
    kv/                  KV snapshots, the snapshot file format, prefix sources
    llama/               thin owners of native handles: model, context, batch, sampler, pool
    process/             threads that are always joined, Ctrl-C handling
    _native/             the cffi binding of libllama

Importing `swarmkv` (or the pure modules: errors, llama.config, llama.budget, llama.sampling,
pipeline.spec, pipeline.toml, pipeline.dag, cli) does not start llama.cpp. The native names
below (Model, Context, Pipeline, Swarm, ...) load the compiled binding on first use (PEP 562
module __getattr__).
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from ._version import __version__ as __version__
from .errors import (
    BatchError,
    ClosedError,
    ConfigError,
    ContextBudgetError,
    ContextCreateError,
    CycleError,
    DagError,
    InitError,
    ModelLoadError,
    NativeCallError,
    PipelineError,
    PoolError,
    SnapshotMismatchError,
    SnapshotWriteError,
    SwarmKVError,
    SwarmKVWarning,
    TimeoutError,
)
from .kv.file import SnapshotHeader
from .llama.constraint import Constraint
from .llama.models import default_model_path
from .llama.sampling import SamplerConfig
from .pipeline.modes import MODES, ForkOptions

if TYPE_CHECKING:
    from ._native import LLAMA_CPP_COMMIT
    from .kv.snapshot import KVSnapshot, capture, read_snapshot_header, restore
    from .llama.batch import Batch, Sampler
    from .llama.config import ContextConfig
    from .llama.context import Context
    from .llama.install_info import info
    from .llama.model import Model
    from .llama.pool import HostBuffer, HostBufferPool
    from .pipeline.builder import Pipeline
    from .swarm.server import Swarm

logging.getLogger("swarmkv").addHandler(logging.NullHandler())

# name -> module that defines it; importing any of these modules loads the native binding
_NATIVE = {
    "LLAMA_CPP_COMMIT": "._native",
    "Batch": ".llama.batch",
    "Sampler": ".llama.batch",
    "info": ".llama.install_info",
    "Context": ".llama.context",
    "ContextConfig": ".llama.config",
    "Model": ".llama.model",
    "HostBuffer": ".llama.pool",
    "HostBufferPool": ".llama.pool",
    "KVSnapshot": ".kv.snapshot",
    "capture": ".kv.snapshot",
    "restore": ".kv.snapshot",
    "read_snapshot_header": ".kv.snapshot",
    "Pipeline": ".pipeline.builder",
    "Swarm": ".swarm.server",
}


def __getattr__(name: str) -> Any:
    module = _NATIVE.get(name)
    if module is None:
        raise AttributeError(f"module 'swarmkv' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


__all__ = [
    "LLAMA_CPP_COMMIT",
    "MODES",
    "Batch",
    "BatchError",
    "ClosedError",
    "ConfigError",
    "Constraint",
    "Context",
    "ContextBudgetError",
    "ContextConfig",
    "ContextCreateError",
    "CycleError",
    "DagError",
    "ForkOptions",
    "HostBuffer",
    "HostBufferPool",
    "InitError",
    "KVSnapshot",
    "Model",
    "ModelLoadError",
    "NativeCallError",
    "Pipeline",
    "PipelineError",
    "PoolError",
    "Sampler",
    "SamplerConfig",
    "SnapshotHeader",
    "SnapshotMismatchError",
    "SnapshotWriteError",
    "Swarm",
    "SwarmKVError",
    "SwarmKVWarning",
    "TimeoutError",
    "capture",
    "default_model_path",
    "info",
    "read_snapshot_header",
    "restore",
]
