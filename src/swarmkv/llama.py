"""The native wrappers of libllama, under their first home's name: `from swarmkv.llama import
Model, Context, ContextConfig` keeps working. They live in model.py, context.py and
context_config.py."""

from __future__ import annotations

from .context import Context, PerfCounters
from .context_config import LLAMA_MAX_SEQ, ContextConfig, FlashAttn, default_threads
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
