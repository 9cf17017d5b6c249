"""The native wrappers of libllama, under their first home's name: `from swarmkv.llama import
Model, Context, ContextConfig` keeps working. They live in model.py and context.py."""

from __future__ import annotations

from .context import (
    LLAMA_MAX_SEQ,
    Context,
    ContextConfig,
    FlashAttn,
    PerfCounters,
    default_threads,
)
from .model import GGUF_MAGIC, Model

__all__ = [
    "GGUF_MAGIC",
    "LLAMA_MAX_SEQ",
    "Context",
    "ContextConfig",
    "FlashAttn",
    "Model",
    "PerfCounters",
    "default_threads",
]
