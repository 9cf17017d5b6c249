"""ContextConfig: every knob of a llama_context SwarmKV sets, validated in pure Python.

No native import here: the CLI and the TOML loader check settings without loading llama.cpp;
context.py turns a config into llama_context_params.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ..checks import check_int
from ..errors import ConfigError, ContextCreateError, SwarmKVWarning
from .budget import GGML_MAX_N_THREADS
from .kernel_switches import Switches, normalize_switches

if TYPE_CHECKING:
    from .model import Model

FlashAttn = Literal["auto", "on", "off"]
FLASH_ATTN_TYPES = {
    "auto": "LLAMA_FLASH_ATTN_TYPE_AUTO",
    "on": "LLAMA_FLASH_ATTN_TYPE_ENABLED",
    "off": "LLAMA_FLASH_ATTN_TYPE_DISABLED",
}
KV_TYPES = {
    "f32": "GGML_TYPE_F32",
    "f16": "GGML_TYPE_F16",
    "bf16": "GGML_TYPE_BF16",
    "q8_0": "GGML_TYPE_Q8_0",
    "q4_0": "GGML_TYPE_Q4_0",
}
LLAMA_MAX_SEQ = 256  # llama-cparams.h; llama.cpp throws past it
# The largest count llama.cpp takes: n_ctx and n_batch are uint32_t in llama_context_params but
# int32_t where they are used (llama_batch_init, token positions), as are top_k and n_threads.
INT32_MAX = 2**31 - 1


def default_threads() -> int:
    """Number of CPUs this process may run on (os.sched_getaffinity); 1 where that is unknown."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)


def _warn_oversubscribed(name: str, value: int) -> None:
    """A SwarmKVWarning, shown once per message by Python's warnings filter (the default
    action): every context of a pipeline validates the same config (host mode makes one per
    branch), and one line says it all.

    A count above the usable CPUs but within ggml's limit is honoured, not capped: it was
    asked for explicitly (to measure oversubscription, say), and a silent cap would change
    what runs. The warning says why it is slow: ggml's threads spin at barriers, so every
    thread past the core count slows each decode (-t 1000 on 2 cores ran 13x slower).
    """
    warnings.warn(
        f"{name}={value} exceeds the {default_threads()} CPUs this process may use; "
        "decoding will be slower",
        SwarmKVWarning,
        stacklevel=2,
    )


@dataclass(frozen=True)
class ContextConfig:
    """Every knob of a llama_context that SwarmKV sets. None means "llama.cpp's/our default".

    swa_full=None resolves to True for sliding-window models: with a window-sized SWA cache
    the cells a sequence keeps depend on how it got them, and on the pinned tree logits past
    the window differed by NMSE ~1e-3 between a context that decoded a document and one that
    restored or forked it. With the full-size cache restore and fork were bit-exact (NMSE 0).
    Exactness is the product, so it is the default; pass swa_full=False to trade it for memory.

    Restores are bit-exact only with the cell layout kept too: see Context.exact_state_flags.

    batch_invariant=True (our llama.cpp patch 0003) makes a row's logits independent of the
    other rows in its ubatch, of how its input was cut into ubatches and of where its KV cells
    sit: the fork then answers exactly what a context of its own answers. It needs flash
    attention (forced on) and a model loaded with repack=False.

    kernel_switches sets the CPU backend's kernel switches for this context alone
    (kernel_switches.py: a mapping or (name, value) pairs, kept as sorted pairs), for
    side-by-side measurements of SwarmKV's kernels; every switch left out keeps its default.
    """

    n_ctx: int = 4096
    n_batch: int = 512
    n_ubatch: int | None = None
    n_seq_max: int = 1
    n_threads: int | None = None
    n_threads_batch: int | None = None
    kv_unified: bool = False
    swa_full: bool | None = None
    flash_attn: FlashAttn = "auto"
    type_k: str = "f16"
    type_v: str = "f16"
    offload_kqv: bool = True
    batch_invariant: bool = False
    kernel_switches: Switches = ()

    def __post_init__(self) -> None:
        # a mapping or any iterable of pairs in, sorted pairs kept (hashable, comparable)
        given: Mapping[str, int] | Iterable[tuple[str, int]] = self.kernel_switches
        object.__setattr__(self, "kernel_switches", normalize_switches(given))

    def validate(self, model: Model) -> None:
        """Check every field against llama.cpp's limits and model's, before any context exists.

        Raises ConfigError for a value of another type or out of range (n_seq_max also must
        not exceed the effective n_batch) and ContextCreateError when one sequence's cells
        exceed n_ctx_train.
        """
        self.check_numbers()
        per_seq = self.n_ctx if self.kv_unified else self.n_ctx // max(self.n_seq_max, 1)
        if per_seq > model.n_ctx_train:
            raise ContextCreateError(
                f"n_ctx={self.n_ctx} ({per_seq} per sequence) exceeds what {model.path.name} "
                f"supports (n_ctx_train={model.n_ctx_train})"
            )
        if self.n_seq_max > self.effective_n_batch:
            # llama.cpp reserves n_batch output rows and GGML_ASSERTs past them
            raise ConfigError(
                f"n_seq_max={self.n_seq_max} exceeds n_batch={self.effective_n_batch}"
            )
        for name in ("n_threads", "n_threads_batch"):
            value = getattr(self, name)
            if value is not None and value > default_threads():
                _warn_oversubscribed(name, value)
        if self.flash_attn not in FLASH_ATTN_TYPES:
            raise ConfigError(
                f"flash_attn must be one of {sorted(FLASH_ATTN_TYPES)}, got {self.flash_attn!r}"
            )
        for name in ("type_k", "type_v"):
            if getattr(self, name) not in KV_TYPES:
                raise ConfigError(f"{name} must be one of {sorted(KV_TYPES)}")
        if self.batch_invariant:
            self._check_batch_invariant(model)

    def check_numbers(self) -> None:
        """Each integer field's type and range, the model aside: ConfigError naming the field
        for a bool, float or string, or a value the C side cannot take (past INT32_MAX, past
        llama.cpp's 256 sequences or ggml's thread limit), before any native call sees it."""
        check_int("n_ctx", self.n_ctx, lo=1, hi=INT32_MAX)
        check_int("n_batch", self.n_batch, lo=1, hi=INT32_MAX)
        if self.n_ubatch is not None:
            ubatch = check_int("n_ubatch", self.n_ubatch)
            if not 1 <= ubatch <= self.n_batch:
                raise ConfigError(f"n_ubatch must be in [1, n_batch={self.n_batch}], got {ubatch}")
        if not 1 <= check_int("n_seq_max", self.n_seq_max) <= LLAMA_MAX_SEQ:
            raise ConfigError(f"n_seq_max must be in [1, {LLAMA_MAX_SEQ}], got {self.n_seq_max}")
        for name in ("n_threads", "n_threads_batch"):
            value = getattr(self, name)
            if value is not None and not 1 <= check_int(name, value) <= GGML_MAX_N_THREADS:
                raise ConfigError(
                    f"{name} must be in [1, {GGML_MAX_N_THREADS}] (ggml's limit), got {value}"
                )

    def _check_batch_invariant(self, model: Model) -> None:
        # The invariant kernels exist for the CPU path only: flash attention one query row at
        # a time (the softmax without it sums in SIMD lanes set by the cell index) and weights
        # as stored or in CPU_REPACK's layout (patch 0011); AMX's and KleidiAI's kernels treat
        # row blocks and lone rows differently.
        if self.flash_attn == "off":
            raise ConfigError("batch_invariant=True needs flash attention: flash_attn='off' given")
        others = model.repacked_without_invariance
        if others:
            raise ConfigError(
                f"batch_invariant=True with repacked weights: {model.path.name} was loaded with "
                f"Model(path, repack=True), and this CPU backend repacks into {', '.join(others)}, "
                "whose kernels have no batch-invariant mode; load it without repack=True, or "
                "pass exact=False (Pipeline) / batch_invariant=False"
            )

    @property
    def effective_n_batch(self) -> int:
        """llama.cpp clamps n_batch to n_ctx; so do we, so the numbers we check are real."""
        return min(self.n_batch, self.n_ctx)

    def state_settings(self, model: Model) -> dict[str, object]:
        """The settings a sequence's saved state depends on (snapshot_file.CONTEXT_FIELDS):
        a context restoring the state must have the same ones."""
        streams = 1 if self.kv_unified or self.n_seq_max == 1 else self.n_seq_max
        return {
            "type_k": self.type_k,
            "type_v": self.type_v,
            # batch-invariant contexts force flash attention on (V is then not transposed)
            "flash_attn": "on" if self.batch_invariant else self.flash_attn,
            # True: the cache keeps every cell (a model without a sliding window always does)
            "swa_full": self.resolved_swa_full(model) if model.n_swa > 0 else True,
            "n_stream": streams,
            "batch_invariant": self.batch_invariant,
        }

    def resolved_swa_full(self, model: Model) -> bool:
        """swa_full with None resolved: True exactly when model has sliding-window attention."""
        return model.n_swa > 0 if self.swa_full is None else self.swa_full
