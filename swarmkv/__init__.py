"""SwarmKV: prefill a shared document once, fan its KV state out to many LLM branches."""

from __future__ import annotations

import logging

from ._native import LLAMA_CPP_COMMIT
from .batch import Batch, Sampler, SamplerConfig
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
    SwarmKVError,
)
from .install_info import info
from .llama import Context, ContextConfig, Model
from .models import default_model_path
from .pool import HostBuffer, HostBufferPool
from .snapshot import KVSnapshot, capture, restore

logging.getLogger("swarmkv").addHandler(logging.NullHandler())

__version__ = "0.1.0"

__all__ = [
    "LLAMA_CPP_COMMIT",
    "Batch",
    "BatchError",
    "ConfigError",
    "Context",
    "ContextBudgetError",
    "ContextConfig",
    "ContextCreateError",
    "CycleError",
    "DagError",
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
    "SnapshotMismatchError",
    "SwarmKVError",
    "capture",
    "default_model_path",
    "info",
    "restore",
]
