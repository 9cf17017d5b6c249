"""Constrained decoding through llguidance: one matcher per branch masks its logits row.

Per model, once (cached; about a second for Gemma 3's 262k tokens): an llguidance tokenizer
built from the GGUF vocabulary through the binding, each token's bytes as llama.cpp renders
them (control tokens marked with a leading 0xFF byte, as llguidance's own llama.cpp glue
does), llama_tokenize itself as its tokenizer, and every end-of-generation token as EOS.

Per branch, a `Guide`: each step its mask (computed for all branches of a step together,
`compute_masks`) sets the disallowed tokens of its row to -inf before the sampler chain
runs, so greedy and sampled decoding both pick only allowed tokens. A mask is per row, so
batch invariance holds: a constrained branch decodes the same tokens alone or among others.
After a token, the tokens the grammar then forces are taken without sampling
(fast-forward) and counted; a grammar that can take nothing more stops the branch.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from .._native import ffi, lib
from ..errors import ConfigError, SwarmKVError
from .constraint import Constraint

if TYPE_CHECKING:
    from .model import Model

_CONTROL = int(lib.LLAMA_TOKEN_ATTR_CONTROL)
_USER_DEFINED = int(lib.LLAMA_TOKEN_ATTR_USER_DEFINED)
_tokenizers: weakref.WeakKeyDictionary[Model, Any] = weakref.WeakKeyDictionary()
_lock = threading.Lock()
_executor: Any = None


class GuideError(SwarmKVError):
    """A constrained branch's grammar refused a token it had allowed (llguidance's error)."""


def tokenizer_for(model: Model) -> Any:
    """The llguidance LLTokenizer of model's vocabulary, built once per model.

    It calls llama_tokenize on the model's vocab pointer: a guide must not outlive its model
    (branches end before their context, contexts before their model)."""
    with _lock:
        tok = _tokenizers.get(model)
        if tok is None:
            tok = _build_tokenizer(model)
            _tokenizers[model] = tok
        return tok


def _build_tokenizer(model: Model) -> Any:
    from llguidance import LLTokenizer

    vocab = model.vocab
    attrs = model.vocab_attrs()
    tokens = []
    for t, attr in enumerate(attrs):
        piece = model.token_to_piece(t, special=True)
        looks_special = piece.startswith(b"<") and piece.endswith(b">")
        if attr & _CONTROL or (attr & _USER_DEFINED and looks_special):
            piece = b"\xff" + piece  # llguidance's mark of a special token
        tokens.append(piece)
    eog = [t for t in range(len(attrs)) if lib.llama_vocab_is_eog(vocab, t)]
    if not eog:
        raise ConfigError("constraints need an end-of-generation token; this vocabulary has none")
    tokenize = ffi.cast("uintptr_t", ffi.addressof(lib, "llama_tokenize"))
    # from_llamacpp is llguidance's own llama.cpp glue (its llamacpp.py), not in its stubs
    return LLTokenizer.from_llamacpp(  # type: ignore[attr-defined]
        tokens=tokens,
        vocab_ptr=int(ffi.cast("uintptr_t", vocab)),
        tokenize_fptr=int(tokenize),
        eos_token=eog,
    )


def executor() -> Any:
    """The one llguidance executor computing a step's masks in parallel (its own threads)."""
    global _executor
    with _lock:
        if _executor is None:
            from llguidance import LLExecutor

            _executor = LLExecutor()
        return _executor


class Guide:
    """One branch's llguidance matcher; use from the thread that steps its branch."""

    def __init__(self, model: Model, constraint: Constraint) -> None:
        from llguidance import LLMatcher

        self.constraint = constraint
        self.n_vocab = model.n_vocab
        tok = tokenizer_for(model)
        self.words = (tok.vocab_size + 31) // 32
        self.matcher = LLMatcher(tok, constraint.llguidance_grammar(), log_level=0)
        if self.matcher.is_error():
            raise ConfigError(f"{constraint.describe()}: {self.matcher.get_error()}")
        self.mask: np.ndarray | None = None  # this step's, from compute_masks
        self.mask_ns: list[int] = []  # per step (a shared computation's share)
        self.host_ns = 0  # applying masks, accepting and fast-forwarding (not the masks)
        self.forced = 0  # tokens taken by fast-forward

    @property
    def constraint_ns(self) -> int:
        """All this branch's constraint work so far: its masks' share, applying them,
        accepting tokens and fast-forwarding."""
        return sum(self.mask_ns) + self.host_ns

    @property
    def stopped(self) -> bool:
        """Whether the grammar can take no more tokens (it is satisfied, or failed)."""
        return bool(self.matcher.is_stopped())

    @property
    def accepting(self) -> bool:
        """Whether the output so far is complete under the grammar."""
        return bool(self.matcher.is_accepting())

    def apply(self, row: np.ndarray) -> None:
        """Set the logits of every token the grammar disallows now to -inf, in place."""
        if self.mask is None:
            compute_masks([self])
        assert self.mask is not None
        self._check()
        t = time.perf_counter_ns()
        bits = np.unpackbits(self.mask.view(np.uint8), bitorder="little")
        allowed = np.zeros(len(row), dtype=bool)
        n = min(len(row), len(bits))
        allowed[:n] = bits[:n]
        np.copyto(row, np.float32(-np.inf), where=~allowed)
        self.mask = None
        self.host_ns += time.perf_counter_ns() - t

    def accept(self, token: int) -> None:
        """Advance the matcher past token (one the mask allowed)."""
        t = time.perf_counter_ns()
        if not self.matcher.consume_token(token):
            self._check()
        self.host_ns += time.perf_counter_ns() - t

    def forced_tokens(self, limit: int) -> list[int]:
        """Up to limit tokens the grammar forces next, consumed (fast-forward)."""
        if limit <= 0 or self.matcher.is_stopped():
            return []
        t = time.perf_counter_ns()
        forced = list(self.matcher.compute_ff_tokens())[:limit]
        if forced and not self.matcher.consume_tokens(forced):
            self._check()
        self.forced += len(forced)
        self.host_ns += time.perf_counter_ns() - t
        return forced

    def _check(self) -> None:
        if self.matcher.is_error():
            raise GuideError(f"{self.constraint.describe()}: {self.matcher.get_error()}")


def compute_masks(guides: list[Guide]) -> None:
    """Every guide's next mask, computed together on llguidance's threads."""
    if not guides:
        return
    words = guides[0].words
    masks = np.empty((len(guides), words), dtype=np.int32)
    t = time.perf_counter_ns()
    executor().unsafe_compute_mask_ptr(
        [(g.matcher, i) for i, g in enumerate(guides)], masks.ctypes.data, words * 4, len(guides)
    )
    share = (time.perf_counter_ns() - t) // len(guides)
    for i, g in enumerate(guides):
        g.mask = masks[i]
        g.mask_ns.append(share)


def check_gbnf(model: Model, text: str) -> None:
    """ConfigError with llama.cpp's own message unless its grammar sampler parses text."""
    messages: list[str] = []
    handler = _Collect(messages)
    llama_log = logging.getLogger("swarmkv.llama")
    llama_log.addHandler(handler)
    try:
        smpl = lib.llama_sampler_init_grammar(model.vocab, text.encode("utf-8"), b"root")
    finally:
        llama_log.removeHandler(handler)
    if smpl == ffi.NULL:
        why = "; ".join(messages) or "no message"
        raise ConfigError(f"gbnf: llama.cpp cannot parse the grammar ({why})")
    lib.llama_sampler_free(smpl)


def check_constraint(model: Model, constraint: Constraint | None) -> None:
    """A constraint fully checked against model before anything is prefilled."""
    if constraint is None:
        return
    constraint.validate()
    if not constraint.by_llguidance:
        check_gbnf(model, constraint.text)


class _Collect(logging.Handler):
    """Collects this thread's ERROR records of llama.cpp's log during one call."""

    def __init__(self, into: list[str]) -> None:
        super().__init__(logging.ERROR)
        self.into = into
        self.thread = threading.get_ident()

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self.thread:
            self.into.append(record.getMessage())
