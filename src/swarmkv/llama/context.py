"""Context (llama_context); its settings, ContextConfig, live in config.py.

Ownership (see owned.py): a Context keeps its Model's native handle alive and is freed by
llama_free once closed and no logits view made from it remains. Use one context from one
thread at a time (pipeline/concurrency.py). Every setting and batch is validated before the native
call, so bad input raises a SwarmKVError and never reaches a C++ exception or abort.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from .._native import ffi, lib
from ..errors import (
    BatchError,
    ClosedError,
    ConfigError,
    ContextCreateError,
    NativeCallError,
    SnapshotMismatchError,
)
from .budget import round_ctx
from .config import FLASH_ATTN_TYPES, KV_TYPES, ContextConfig, default_threads
from .cpu_backend import check_switch_values, context_switches, set_context_switches
from .kvmath import estimate_kv_bytes, mem_available_bytes
from .model import Model
from .owned import Owned

if TYPE_CHECKING:
    from .batch import Batch

_SERIALS = itertools.count(1)

__all__ = ["Context", "MemoryBytes", "PerfCounters", "context_params"]


@dataclass(frozen=True)
class PerfCounters:
    """A context's decode timings (llama_perf_context); times in milliseconds.

    t_p_eval_ms/n_p_eval: decodes of more than one token (n_p_eval counts tokens);
    t_eval_ms/n_eval: single-token decodes. llama.cpp reports each count as at least 1.
    """

    t_p_eval_ms: float
    t_eval_ms: float
    n_p_eval: int
    n_eval: int


@dataclass(frozen=True)
class MemoryBytes:
    """A context's memory as llama.cpp accounts it (allocated buffers, all devices), in bytes:
    the model's weights, the context's own memory (the KV cache) and its compute buffers."""

    model: int
    kv: int
    compute: int


class Context(Owned):
    """A llama_context. Use from one thread at a time (see pipeline/concurrency.py)."""

    def __init__(self, model: Model, config: ContextConfig | None = None, **overrides: Any) -> None:
        config = config or ContextConfig()
        if overrides:
            config = replace(config, **overrides)
        # Held from here on, the model's keeper keeps its native handle alive even if another
        # thread closes the model while this context is being made (ClosedError if it is).
        model_keeper = model._hold()
        config.validate(model)
        check_switch_values(config.kernel_switches)  # before any context exists
        self._check_memory(model, config)
        self.model = model  # strong reference: the model outlives its contexts
        self.config = config
        params = context_params(config, model)
        ptr = lib.llama_init_from_model(model._ptr, params)
        if ptr == ffi.NULL:
            raise ContextCreateError(
                f"llama_init_from_model failed (n_ctx={config.n_ctx}, n_batch={config.n_batch}, "
                f"n_seq_max={config.n_seq_max}); see the swarmkv.llama log"
            )
        self._ptr: Any = ptr
        # the model is freed after this context
        self._own(lib.llama_free, ptr, parent=model_keeper)
        if config.batch_invariant and not lib.llama_set_batch_invariant(ptr, True):
            self.close()
            raise ConfigError(
                "batch_invariant=True: a backend of this context has no batch-invariant mode "
                "(it exists for the CPU backend only): pass exact=False / batch_invariant=False"
            )
        if config.kernel_switches:
            try:
                set_context_switches(ptr, config.kernel_switches)
            except ConfigError:
                self.close()
                raise
        try:
            model._add_context(self)  # close() of the model now refuses while this is open
        except ClosedError:
            self.close()
            raise
        self._mem = lib.llama_get_memory(ptr)
        self._device_gen: dict[int, int] = {}  # ON_DEVICE captures per source seq id
        self._serial = next(_SERIALS)  # unlike id(), never reused by a later context
        self.n_vocab = model.n_vocab
        self.n_ctx = int(lib.llama_n_ctx(ptr))
        # without kv_unified each sequence has its own stream of n_ctx / n_seq_max cells
        self.n_ctx_seq = int(lib.llama_n_ctx_seq(ptr))
        self.n_batch = int(lib.llama_n_batch(ptr))
        self.n_seq_max = int(lib.llama_n_seq_max(ptr))

    @staticmethod
    def _check_memory(model: Model, config: ContextConfig) -> None:
        cells = config.n_ctx
        if not config.kv_unified and config.n_seq_max > 1:  # llama.cpp pads each stream to 256
            cells = round_ctx(config.n_ctx // config.n_seq_max) * config.n_seq_max
        need = estimate_kv_bytes(model, cells, config.type_k, config.type_v)
        avail = mem_available_bytes()
        if avail is not None and need > avail:
            raise ContextCreateError(
                f"a KV cache of n_ctx={config.n_ctx} needs about {need / 2**20:.0f} MiB, "
                f"but only {avail / 2**20:.0f} MiB of memory is available"
            )

    # -- lifetime -------------------------------------------------------------------------
    @property
    def ptr(self) -> Any:
        """The llama_context pointer; raises ClosedError once the context is closed."""
        return self._live(self._ptr)

    # -- decode ---------------------------------------------------------------------------
    def decode(self, batch: Batch) -> None:
        """Decode a batch; positions must continue each sequence's memory (checked first)."""
        n = batch.n_tokens
        if n == 0:
            raise BatchError("cannot decode an empty batch")
        if n > self.n_batch:
            raise BatchError(f"batch of {n} tokens exceeds n_batch={self.n_batch}")
        bad = next((t for t in batch.tokens() if t >= self.n_vocab), None)
        if bad is not None:  # llama.cpp would read past its embedding table
            raise BatchError(f"token id {bad} is out of range [0, {self.n_vocab}) of this model")
        for seq_id, (first, last) in batch.seq_spans().items():
            self.check_seq(seq_id)
            expected = self.seq_len(seq_id)
            if expected > 0 and first != expected:
                raise BatchError(
                    f"position gap in seq {seq_id}: memory ends at pos {expected - 1}, "
                    f"batch starts at pos {first} (must be {expected})"
                )
            if last >= self.n_ctx_seq:
                raise BatchError(
                    f"seq {seq_id} would reach pos {last}, past its {self.n_ctx_seq} cells "
                    f"(n_ctx={self.n_ctx}, n_seq_max={self.n_seq_max})"
                )
        rc = int(lib.llama_decode(self.ptr, batch.raw))
        if rc != 0:
            raise NativeCallError("llama_decode", rc, _decode_reason(rc, n, self.n_ctx))

    def logits(self, i: int, *, writable: bool = False) -> np.ndarray:
        """Logits of batch row i (negative counts from the end) of the last decode.

        A view into llama.cpp's buffer, read-only unless writable (a constraint masks its
        row in place, so that llama.cpp's sampler chain reads the masked row): the next
        decode overwrites it (`.copy()` to keep it), and it keeps the context's memory alive,
        so reading it even after `close()` is safe.
        """
        ptr = lib.llama_get_logits_ith(self.ptr, i)
        if ptr == ffi.NULL:
            raise NativeCallError("llama_get_logits_ith", 0, f"no logits for batch row {i}")
        view = np.frombuffer(ffi.buffer(self._export(ffi, ptr), 4 * self.n_vocab), np.float32)
        view.flags.writeable = writable
        return view

    # -- memory (KV cache) ------------------------------------------------------------------
    def check_seq(self, seq_id: int) -> None:
        """Raise BatchError unless 0 <= seq_id < n_seq_max."""
        if not 0 <= seq_id < self.n_seq_max:
            raise BatchError(f"seq_id {seq_id} outside [0, n_seq_max={self.n_seq_max})")

    def memory_clear(self, data: bool = True) -> None:
        """Clear the whole KV memory (llama_memory_clear); data=True also clears the buffers."""
        lib.llama_memory_clear(lib.llama_get_memory(self.ptr), data)

    def seq_rm(self, seq_id: int | None, p0: int | None = None, p1: int | None = None) -> None:
        """Remove seq_id's cells in [p0, p1) (llama_memory_seq_rm); None is an open end.

        seq_id None means every sequence; any other is checked first (BatchError). Raises
        NativeCallError when llama.cpp refuses (a partial range it cannot remove).
        """
        if seq_id is not None:
            self.check_seq(seq_id)
        a, b = _span(p0, p1)
        sid = -1 if seq_id is None else seq_id  # llama.cpp's "every sequence"
        if not lib.llama_memory_seq_rm(self._memory(), sid, a, b):
            raise NativeCallError("llama_memory_seq_rm", 0, f"seq {seq_id} [{p0}, {p1})")

    def seq_cp(self, src: int, dst: int, p0: int | None = None, p1: int | None = None) -> None:
        """Copy src's cells in [p0, p1) to dst (llama_memory_seq_cp); None is an open end.

        Raises BatchError for a bad seq id or position, and ConfigError before the native call
        for a partial range with per-sequence KV streams (kv_unified=False, n_seq_max > 1):
        llama.cpp asserts.
        """
        self.check_seq(src)
        self.check_seq(dst)
        a, b = _span(p0, p1)
        if not self.config.kv_unified and self.n_seq_max > 1 and (a > 0 or b >= 0):
            # per-sequence KV streams copy whole buffers; llama.cpp GGML_ASSERTs on a range
            raise ConfigError(f"seq_cp of positions [{p0}, {p1}) needs kv_unified=True")
        lib.llama_memory_seq_cp(self._memory(), src, dst, a, b)

    def seq_keep(self, seq_id: int) -> None:
        """Remove every cell not in seq_id (llama_memory_seq_keep); BatchError for a bad seq id."""
        self.check_seq(seq_id)
        lib.llama_memory_seq_keep(self._memory(), seq_id)

    def seq_add(self, seq_id: int, p0: int | None, p1: int | None, delta: int) -> None:
        """Add delta to seq_id's positions in [p0, p1) (llama_memory_seq_add); None: open end.

        Raises BatchError for a bad seq id or position, before the native call.
        """
        self.check_seq(seq_id)
        a, b = _span(p0, p1)
        lib.llama_memory_seq_add(self._memory(), seq_id, a, b, delta)

    def seq_pos_min(self, seq_id: int) -> int | None:
        """Smallest position held for seq_id (llama_memory_seq_pos_min); None when empty."""
        self.check_seq(seq_id)
        return _pos_or_none(lib.llama_memory_seq_pos_min(self._memory(), seq_id))

    def seq_pos_max(self, seq_id: int) -> int | None:
        """Largest position held for seq_id (llama_memory_seq_pos_max); None when empty."""
        self.check_seq(seq_id)
        return _pos_or_none(lib.llama_memory_seq_pos_max(self._memory(), seq_id))

    def seq_len(self, seq_id: int) -> int:
        """Where seq_id's next token goes: its largest position + 1, or 0 when it is empty."""
        last = self.seq_pos_max(seq_id)
        return 0 if last is None else last + 1

    def _memory(self) -> Any:
        return self._live(self._mem)

    # -- state ----------------------------------------------------------------------------
    @property
    def exact_state_flags(self) -> int:
        """State flags that make a restored sequence layout-identical to its source.

        llama.cpp leaves SWA-masked cells out of a sequence's state, so a restoring context
        holds the window at other cell indices than the context that decoded it; attention
        then sums in another order and logits drift (NMSE ~1e-3..1e-2 on Gemma 3). With the
        full-size SWA cache our patch's KEEP_SWA_MASKED flag keeps those cells, and restore
        becomes bit-exact. Without swa_full the cells do not fit, so no flag.
        """
        if self.model.n_swa > 0 and self.config.resolved_swa_full(self.model):
            return int(lib.LLAMA_STATE_SEQ_FLAGS_KEEP_SWA_MASKED)
        return 0

    def state_settings(self) -> dict[str, object]:
        """The settings this context's sequence states depend on (ContextConfig.state_settings)."""
        return self.config.state_settings(self.model)

    def device_snapshot_taken(self, seq_id: int) -> tuple[int, int]:
        """Record an ON_DEVICE capture of seq_id; returns its token (context id, generation).

        llama.cpp keeps one device copy per source sequence and a new capture overwrites it,
        so only the latest token restores (checked by snapshot.check_restorable)."""
        gen = self._device_gen.get(seq_id, 0) + 1
        self._device_gen[seq_id] = gen
        return (self._serial, gen)

    def device_snapshot_current(self, seq_id: int) -> tuple[int, int] | None:
        """The token of seq_id's live ON_DEVICE capture in this context, or None."""
        gen = self._device_gen.get(seq_id)
        return None if gen is None or self.closed else (self._serial, gen)

    def state_seq_size(self, seq_id: int, flags: int = 0) -> int:
        """Size in bytes of seq_id's state with flags (llama_state_seq_get_size_ext).

        Raises BatchError for a bad seq id, before the native call.
        """
        self.check_seq(seq_id)
        return int(lib.llama_state_seq_get_size_ext(self.ptr, seq_id, flags))

    def state_seq_get(self, seq_id: int, dst: memoryview, flags: int = 0) -> int:
        """Write seq_id's state into dst; returns the byte count, checked against the size."""
        self.check_seq(seq_id)
        need = self.state_seq_size(seq_id, flags)
        if len(dst) < need:
            raise BatchError(f"state of seq {seq_id} needs {need} bytes, buffer has {len(dst)}")
        buf = ffi.from_buffer("uint8_t[]", dst, require_writable=True)
        n = int(lib.llama_state_seq_get_data_ext(self.ptr, buf, len(dst), seq_id, flags))
        if n != need:
            raise NativeCallError(
                "llama_state_seq_get_data_ext", n, f"seq={seq_id}: wrote {n} of {need} bytes"
            )
        return n

    def state_seq_set(self, seq_id: int, src: memoryview | bytes, flags: int = 0) -> int:
        """Restore seq_id from src; every byte must be consumed."""
        self.check_seq(seq_id)
        buf = ffi.from_buffer("uint8_t[]", src)
        n = int(lib.llama_state_seq_set_data_ext(self.ptr, buf, len(src), seq_id, flags))
        if n != len(src):
            raise SnapshotMismatchError(
                f"llama_state_seq_set_data_ext(seq={seq_id}): consumed {n} of {len(src)} bytes "
                "(no free cells for it, or a snapshot of another model, other context "
                "settings, or corrupt: see the swarmkv.llama log)"
            )
        return n

    def kernel_switches(self) -> dict[str, int]:
        """Every CPU kernel switch's value on this context (kernel_switches.py), defaults
        included; -1 for each when the context has no CPU backend with switches."""
        return context_switches(self._ptr)

    def memory_bytes(self) -> MemoryBytes:
        """llama.cpp's own accounting of this context's buffers (patch 0006)."""
        sizes = ffi.new("size_t[3]")
        lib.llama_swarmkv_memory_bytes(self.ptr, sizes, sizes + 1, sizes + 2)
        return MemoryBytes(int(sizes[0]), int(sizes[1]), int(sizes[2]))

    def perf(self) -> PerfCounters:
        """Decode counters since the last reset (llama_perf_context), after llama_synchronize."""
        # llama.cpp counts a decode when it synchronizes, which a decode without logits
        # has not done yet.
        lib.llama_synchronize(self.ptr)
        data = lib.llama_perf_context(self.ptr)
        return PerfCounters(data.t_p_eval_ms, data.t_eval_ms, data.n_p_eval, data.n_eval)

    def perf_reset(self) -> None:
        """Zero the decode counters (llama_perf_context_reset), after llama_synchronize."""
        lib.llama_synchronize(self.ptr)
        lib.llama_perf_context_reset(self.ptr)


def context_params(config: ContextConfig, model: Model) -> Any:
    """llama_context_params for model: llama_context_default_params with config set.

    n_threads defaults to default_threads() and n_threads_batch to n_threads; n_batch is
    clamped to n_ctx and n_ubatch (default n_batch) to that; perf counters are on.
    """
    params = lib.llama_context_default_params()
    threads = config.n_threads or default_threads()
    params.n_ctx = config.n_ctx
    params.n_batch = config.effective_n_batch
    params.n_ubatch = min(config.n_ubatch or config.n_batch, config.effective_n_batch)
    params.n_seq_max = config.n_seq_max
    params.n_threads = threads
    params.n_threads_batch = config.n_threads_batch or threads
    params.kv_unified = config.kv_unified
    params.swa_full = config.resolved_swa_full(model)
    flash = "on" if config.batch_invariant else config.flash_attn  # validated: not "off"
    params.flash_attn_type = getattr(lib, FLASH_ATTN_TYPES[flash])
    params.type_k = getattr(lib, KV_TYPES[config.type_k])
    params.type_v = getattr(lib, KV_TYPES[config.type_v])
    params.offload_kqv = config.offload_kqv
    params.no_perf = False
    return params


def _span(p0: int | None, p1: int | None) -> tuple[int, int]:
    """[p0, p1) as llama.cpp's arguments (-1 = open end); BatchError for a negative bound."""
    for name, p in (("p0", p0), ("p1", p1)):
        if p is not None and p < 0:
            raise BatchError(f"{name} must be >= 0 or None (an open end), got {p}")
    if p0 is not None and p1 is not None and p1 < p0:
        raise BatchError(f"empty position range [{p0}, {p1})")
    return (-1 if p0 is None else p0), (-1 if p1 is None else p1)


def _pos_or_none(pos: int) -> int | None:
    return None if pos < 0 else int(pos)  # llama.cpp answers -1 for an empty sequence


def _decode_reason(rc: int, n_tokens: int, n_ctx: int) -> str:
    if rc == 1:
        return f"no KV slot for a batch of {n_tokens} tokens (n_ctx={n_ctx}): context is full"
    if rc == 2:
        return "aborted"
    if rc == -1:
        return "invalid input batch (see the swarmkv.llama log)"
    return "fatal error in llama_decode (see the swarmkv.llama log)"
