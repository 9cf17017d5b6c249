"""Batch (llama_batch with explicit positions and sequence ids) and Sampler (a sampler chain)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .._native import ffi, lib
from ..errors import BatchError, ConfigError, InitError
from .config import LLAMA_MAX_SEQ
from .owned import Owned
from .sampling import SamplerConfig

__all__ = ["Batch", "Sampler", "SamplerConfig"]

if TYPE_CHECKING:
    from .context import Context
    from .model import Model


def _check_int32(what: str, value: object, low: int, high: int = 2**31) -> None:
    """BatchError unless value is an int in [low, high) (llama.cpp's int32 fields)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise BatchError(f"{what} must be an integer, got {value!r}")
    if not low <= int(value) < high:
        bound = "2**31" if high == 2**31 else str(high)
        raise BatchError(f"{what} {value} is out of range [{low}, {bound})")


def _free_nothing(_arrays: object) -> None:
    """A batch's memory is cffi's: it goes with the last reference to its arrays."""


def _alloc_batch(capacity: int, n_seq_max: int) -> tuple[Any, tuple[Any, ...]]:
    """A llama_batch of capacity rows (token ids, no embeddings), its arrays allocated here
    as llama_batch_init lays them out, and the arrays it points into.

    Not llama_batch_init: it does not check its mallocs and writes through the seq_id one
    (a crash when memory is short); cffi raises MemoryError instead, made an InitError here.
    """
    seq_bytes = capacity * n_seq_max * ffi.sizeof("llama_seq_id")
    try:
        raw = ffi.new("llama_batch *")
        token = ffi.new("llama_token[]", capacity)
        pos = ffi.new("llama_pos[]", capacity)
        n_seq_id = ffi.new("int32_t[]", capacity)
        seq_ids = ffi.new("llama_seq_id[]", capacity * n_seq_max)
        seq_id = ffi.new("llama_seq_id *[]", capacity + 1)  # NULL-terminated, as llama.cpp's
        logits = ffi.new("int8_t[]", capacity)
    except MemoryError:
        raise InitError(
            f"cannot allocate a batch of {capacity} tokens x {n_seq_max} sequences "
            f"({capacity * (4 + 4 + 4 + 1 + ffi.sizeof('void *')) + seq_bytes} bytes)"
        ) from None
    # row i's sequence ids start at seq_ids + i * n_seq_max (one store, not capacity mallocs)
    base = int(ffi.cast("uintptr_t", seq_ids))
    rows = base + np.arange(capacity, dtype=np.uintp) * np.uintp(
        n_seq_max * ffi.sizeof("llama_seq_id")
    )
    ffi.memmove(seq_id, rows.tobytes(), capacity * ffi.sizeof("void *"))
    raw.token, raw.pos, raw.n_seq_id, raw.seq_id, raw.logits = token, pos, n_seq_id, seq_id, logits
    return raw, (raw, token, pos, n_seq_id, seq_ids, seq_id, logits)


class Batch(Owned):
    """A llama_batch of at most `capacity` tokens, each in up to `n_seq_max` sequences.

    Positions are explicit and absolute. Within one batch a sequence's positions must be
    consecutive (checked here, as rows are added); Context.decode then checks that each
    sequence continues where its memory ends. Sizes are checked first (BatchError, a
    ConfigError); InitError when the memory cannot be allocated.
    """

    def __init__(self, capacity: int, n_seq_max: int = 1) -> None:
        _check_int32("batch capacity", capacity, 1)
        _check_int32("batch n_seq_max", n_seq_max, 1, LLAMA_MAX_SEQ + 1)
        self.capacity = capacity = int(capacity)
        self.n_seq_max = n_seq_max = int(n_seq_max)
        raw, arrays = _alloc_batch(capacity, n_seq_max)
        self._raw = raw
        self._spans: dict[int, list[int]] = {}
        self._own(_free_nothing, arrays)

    @property
    def raw(self) -> Any:
        """The llama_batch struct; raises ClosedError once the batch is closed."""
        return self._live(self._raw[0])

    @property
    def n_tokens(self) -> int:
        """Number of rows (tokens) added since the last clear(); ClosedError once closed."""
        return int(self.raw.n_tokens)

    def clear(self) -> None:
        """Empty the batch for reuse: n_tokens = 0 and the sequence spans forgotten."""
        self.raw.n_tokens = 0
        self._spans.clear()

    def seq_spans(self) -> dict[int, tuple[int, int]]:
        """First and last position of each sequence in the batch."""
        return {s: (span[0], span[1]) for s, span in self._spans.items()}

    def add(self, token: int, pos: int, seq_ids: Sequence[int], logits: bool = False) -> int:
        """Append one row; returns its index (the i for Context.logits).

        Every argument is checked before anything is written, so a refused row leaves the
        batch as it was (BatchError naming the value); Context.decode checks token ids
        against the model's vocabulary.
        """
        raw = self.raw
        i = int(raw.n_tokens)
        if i >= self.capacity:
            raise BatchError(f"batch is full ({self.capacity} tokens)")
        _check_int32("token id", token, 0)
        _check_int32("position", pos, 0)
        if not seq_ids or len(seq_ids) > self.n_seq_max:
            raise BatchError(f"a token needs 1..{self.n_seq_max} seq ids, got {len(seq_ids)}")
        for s in seq_ids:
            _check_int32("seq_id", s, 0)
            span = self._spans.get(s)
            if span is not None and pos != span[1] + 1:
                raise BatchError(f"position gap in seq {s}: pos {pos} follows pos {span[1]}")
        for s in seq_ids:
            self._track(s, pos)
        raw.token[i] = token
        raw.pos[i] = pos
        raw.n_seq_id[i] = len(seq_ids)
        for j, s in enumerate(seq_ids):
            raw.seq_id[i][j] = s
        raw.logits[i] = 1 if logits else 0
        raw.n_tokens = i + 1
        return i

    def tokens(self) -> list[int]:
        """The token ids of the rows added since the last clear()."""
        raw = self.raw
        return [int(raw.token[i]) for i in range(int(raw.n_tokens))]

    def _track(self, seq_id: int, pos: int) -> None:
        span = self._spans.get(seq_id)
        if span is None:
            self._spans[seq_id] = [pos, pos]
        else:
            span[1] = pos

    def add_sequence(
        self, tokens: Iterable[int], pos0: int, seq_id: int, logits_last: bool = True
    ) -> int:
        """Append tokens at positions pos0, pos0+1, ... of one sequence; returns the last row."""
        toks = list(tokens)
        if not toks:
            raise BatchError("add_sequence needs at least one token")
        last = -1
        for k, tok in enumerate(toks):
            last = self.add(tok, pos0 + k, (seq_id,), logits_last and k == len(toks) - 1)
        return last


class Sampler(Owned):
    """A llama sampler chain. One sampler per branch; use from one thread at a time."""

    def __init__(self, config: SamplerConfig | None = None, model: Model | None = None) -> None:
        """model: the vocabulary a GBNF constraint is parsed against (required for one)."""
        self.config = config or SamplerConfig()
        self.config.validate()
        c = self.config.constraint
        self._gbnf = None if c is None or c.by_llguidance else c.text.encode("utf-8")
        if self._gbnf is not None and model is None:
            raise ConfigError("a GBNF constraint needs the model: Sampler(config, model)")
        self._vocab = model.vocab if self._gbnf is not None and model is not None else None
        chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        if chain == ffi.NULL:
            raise InitError("llama_sampler_chain_init returned NULL")
        self._ptr: Any = chain
        self._own(lib.llama_sampler_free, chain)
        for name, make in self._stages():
            stage = make()
            if stage == ffi.NULL:
                self.close()  # frees the chain and the stages already added to it, now
                if name == "grammar":
                    raise ConfigError("gbnf: llama.cpp cannot parse the grammar (see its log)")
                raise InitError(f"llama_sampler_init_{name} returned NULL")
            lib.llama_sampler_chain_add(chain, stage)  # the chain now owns the stage

    def _stages(self) -> list[tuple[str, Callable[[], Any]]]:
        """Each stage's name and its llama_sampler_init_* call, made one at a time: a stage
        is owned by nobody until the chain takes it."""
        c = self.config
        stages: list[tuple[str, Callable[[], Any]]] = []
        if self._gbnf is not None:  # first: every later stage sees only what it allows
            grammar = functools.partial(
                lib.llama_sampler_init_grammar, self._vocab, self._gbnf, b"root"
            )
            stages.append(("grammar", grammar))
        if c.greedy:
            return [*stages, ("greedy", lib.llama_sampler_init_greedy)]
        if c.top_k is not None:
            stages.append(("top_k", functools.partial(lib.llama_sampler_init_top_k, c.top_k)))
        if c.top_p is not None:
            stages.append(("top_p", functools.partial(lib.llama_sampler_init_top_p, c.top_p, 1)))
        if c.min_p is not None:
            stages.append(("min_p", functools.partial(lib.llama_sampler_init_min_p, c.min_p, 1)))
        stages.append(("temp", functools.partial(lib.llama_sampler_init_temp, c.temperature)))
        stages.append(("dist", functools.partial(lib.llama_sampler_init_dist, c.seed)))
        return stages

    @property
    def ptr(self) -> Any:
        """The llama_sampler chain pointer; raises ClosedError once the sampler is closed."""
        return self._live(self._ptr)

    def sample(self, ctx: Context, i: int) -> int:
        """Sample from batch row i of ctx's last decode (and accept the token)."""
        # llama_sampler_sample GGML_ASSERTs (aborts the process) on a row without logits;
        # ctx.logits raises a Python error for that row instead.
        ptr = self.ptr  # raises once the sampler is closed, on every path
        logits = ctx.logits(i)
        if self.config.greedy and self._gbnf is None:
            # The greedy sampler keeps no state, and llama_sampler_sample would first build a
            # candidate array over the whole vocabulary (262k entries on Gemma 3, ~1 ms per
            # branch and step); argmax picks the same token (the first maximum, as it does).
            return int(np.argmax(logits))
        return int(lib.llama_sampler_sample(ptr, ctx.ptr, i))

    def reset(self) -> None:
        """Reset the state of every stage in the chain (llama_sampler_reset)."""
        lib.llama_sampler_reset(self.ptr)
