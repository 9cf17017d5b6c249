"""SwarmKV: prefill a shared document once, fan its KV state out to many LLM branches.

Importing `swarmkv` (or its pure modules: dag, budget, modes, sampling, results, errors,
pipeline_toml, cli) does not start llama.cpp. The native names below (Model, Context,
HostBufferPool, ...) load the compiled binding on first use (PEP 562 module __getattr__).
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from .errors import (
    BatchError,
    ConfigError,
    ContextBudgetError,
    ContextCreateError,
    CycleError,
    DagError,
    ModelLoadError,
    NativeCallError,
    PipelineError,
    PoolError,
    SnapshotMismatchError,
    SnapshotWriteError,
    SwarmKVError,
)
from .models import default_model_path
from .modes import MODES, ForkOptions
from .sampling import SamplerConfig
from .snapshot_file import SnapshotHeader

if TYPE_CHECKING:
    from ._native import LLAMA_CPP_COMMIT
    from .batch import Batch, Sampler
    from .context import Context
    from .context_config import ContextConfig
    from .install_info import info
    from .model import Model
    from .pool import HostBuffer, HostBufferPool
    from .snapshot import KVSnapshot, capture, read_snapshot_header, restore

logging.getLogger("swarmkv").addHandler(logging.NullHandler())

__version__ = "0.1.0"

# name -> module that defines it; importing any of these modules loads the native binding
_NATIVE = {
    "LLAMA_CPP_COMMIT": "._native",
    "Batch": ".batch",
    "Sampler": ".batch",
    "info": ".install_info",
    "Context": ".context",
    "ContextConfig": ".context_config",
    "Model": ".model",
    "HostBuffer": ".pool",
    "HostBufferPool": ".pool",
    "KVSnapshot": ".snapshot",
    "capture": ".snapshot",
    "restore": ".snapshot",
    "read_snapshot_header": ".snapshot",
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
    "ConfigError",
    "Context",
    "ContextBudgetError",
    "ContextConfig",
    "ContextCreateError",
    "CycleError",
    "DagError",
    "ForkOptions",
    "HostBuffer",
    "HostBufferPool",
    "KVSnapshot",
    "Model",
    "ModelLoadError",
    "NativeCallError",
    "PipelineError",
    "PoolError",
    "Sampler",
    "SamplerConfig",
    "SnapshotHeader",
    "SnapshotMismatchError",
    "SnapshotWriteError",
    "SwarmKVError",
    "capture",
    "default_model_path",
    "info",
    "read_snapshot_header",
    "restore",
]
