"""A sequence being decoded (BranchState) and how a prefill is cut into chunks.

Sequence invariants (per context):

| seq        | holds                                   | written by                        |
|------------|-----------------------------------------|-----------------------------------|
| prefix seq | document tokens at positions [0, P)     | the engine's document chunks      |
| branch seq | prefix [0, W) + prompt + generated      | seq_cp / restore, then the engine |

A branch's prompt starts at position W (its prefix length), never at 0; each generated token
continues at the next position (tokens a grammar forces are decoded in the same step as the
sampled token before them). Finished branches free their cells with seq_rm.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigError
from ..llama.sampling import RowCallback, SamplerConfig, TokenCallback

if TYPE_CHECKING:
    from ..llama.context import Context
    from ..llama.model import Model


def chunk_bounds(n_tokens: int, n_batch: int, cuts: Sequence[int] = ()) -> list[tuple[int, int]]:
    """[start, end) chunks of at most n_batch tokens; every cut (watermark) is a boundary.

    The baseline uses the same bounds as the shared prefill, so both decode identical shapes.
    """
    if n_batch < 1:
        raise ConfigError(f"n_batch must be >= 1, got {n_batch}")
    edges = sorted({0, n_tokens, *(c for c in cuts if 0 < c < n_tokens)})
    bounds: list[tuple[int, int]] = []
    for lo, hi in itertools.pairwise(edges):
        bounds.extend((s, min(s + n_batch, hi)) for s in range(lo, hi, n_batch))
    return bounds


@dataclass
class BranchState:
    """One branch being decoded: its sequence, sampler, output and stop rules."""

    name: str
    seq_id: int
    prompt_tokens: list[int]
    n_predict: int
    sampler: Any  # llama.batch.Sampler, or a test's fake with sample() and close()
    model: Model
    pos: int  # next position to decode
    stop: tuple[str, ...] = ()
    on_token: TokenCallback | None = None
    keep_logits: bool | str = False  # True: first step's logits; "all": every step's
    on_row: RowCallback | None = None
    guide: Any = None  # llama.guide.Guide: the branch's constraint (llguidance), or None
    tokens: list[int] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)  # output tokens not yet decoded
    step_logits: list[np.ndarray] = field(default_factory=list)
    capture_ns: int = 0
    text_bytes: bytearray = field(default_factory=bytearray)
    stop_reason: str | None = None
    error: BaseException | None = None
    t_start_ns: int = 0
    t_first_ns: int | None = None
    t_end_ns: int | None = None

    @property
    def done(self) -> bool:
        """Whether the branch has stopped (a stop reason) or failed (an error)."""
        return self.stop_reason is not None or self.error is not None

    @property
    def decoded(self) -> list[int]:
        """The output tokens in the cells: all but those chosen after the last decode (the
        last sampled token, and any its grammar forced); an EOG token is never recorded."""
        return self.tokens[: len(self.tokens) - len(self.pending)]

    @property
    def text(self) -> str:
        """Generated text as UTF-8 (invalid bytes replaced), cut at the first stop string."""
        text = self.text_bytes.decode("utf-8", errors="replace")
        for s in self.stop:
            cut = text.find(s)
            if cut >= 0:
                text = text[:cut]
        return text

    def take(self, ctx: Context, row: int) -> None:
        """Sample from batch row `row` (its logits masked first under a constraint), record
        the token and any the grammar then forces, and decide whether to stop."""
        if self.guide is not None:
            self.guide.apply(ctx.logits(row, writable=True))
        if self.keep_logits == "all" or (self.keep_logits and not self.step_logits):
            t = time.perf_counter_ns()
            self.step_logits.append(ctx.logits(row).copy())
            self.capture_ns += time.perf_counter_ns() - t
        token = self.sampler.sample(ctx, row)
        if self.on_row is not None:
            self.on_row(ctx.logits(row), token)
        if self.t_first_ns is None:
            self.t_first_ns = time.perf_counter_ns()
        if self.model.is_eog(token):  # under a grammar, allowed only once it is complete
            self.stop_reason = "eog"
            return
        self._record(token)
        if self.guide is not None:
            self.guide.accept(token)
            self._fast_forward()

    def _record(self, token: int) -> None:
        """One more output token (sampled or forced): to decode next, its text, the stops."""
        self.tokens.append(token)
        self.pending.append(token)
        piece = self.model.token_to_piece(token)
        self.text_bytes += piece
        if self.on_token is not None:
            self.on_token(self.name, token, piece.decode("utf-8", errors="replace"))
        if self.stop and self._hit_stop(len(piece)):
            self.stop_reason = "stop"
        elif len(self.tokens) >= self.n_predict:
            self.stop_reason = "length"

    def _fast_forward(self) -> None:
        """Take the tokens the grammar forces now (they are decoded with the sampled one),
        stop when it can take nothing more, and call a cut before completion `truncated`."""
        guide = self.guide
        assert guide is not None
        if not self.done:
            for token in guide.forced_tokens(self.n_predict - len(self.tokens)):
                self._record(token)
                if self.done:
                    break
        if not self.done and guide.stopped:
            self.stop_reason = "grammar"
        if self.stop_reason == "length" and not guide.accepting:
            self.stop_reason = "truncated"

    def _hit_stop(self, n_new: int) -> bool:
        """Whether a stop string ends in the last n_new bytes (only the tail is searched, so a
        long answer costs the same per token). UTF-8 is self-synchronizing: a stop string's
        bytes occur in the text's bytes exactly where the string occurs in the text."""
        if n_new == 0:
            return False
        for s in self.stop:
            sb = s.encode("utf-8")
            if sb in self.text_bytes[-(len(sb) + n_new - 1) :]:
                return True
        return False

    def span_ns(self) -> tuple[int, int]:
        """(first token, end) timestamps; a branch that generated nothing, or is still
        running, counts from its end, or from now."""
        now = time.perf_counter_ns()
        return self.t_first_ns or self.t_end_ns or now, self.t_end_ns or now

    def fail(self, exc: BaseException) -> None:
        """Record exc as the branch's error, which makes it done."""
        self.error = exc


def new_state(
    model: Model,
    name: str,
    seq_id: int,
    prompt_tokens: list[int],
    prefix_len: int,
    n_predict: int,
    sampler: SamplerConfig,
    *,
    stop: tuple[str, ...] = (),
    on_token: TokenCallback | None = None,
    keep_logits: bool | str = False,
    make_sampler: Any = None,
    on_row: RowCallback | None = None,
) -> BranchState:
    """A branch about to decode its prompt at positions prefix_len, prefix_len+1, ...
    (make_sampler(config, model): the sampler chain's factory; default llama.batch.Sampler).
    A constraint llguidance applies gets its Guide here."""
    if make_sampler is None:
        from ..llama.batch import Sampler as make_sampler
    guide = None
    if sampler.constraint is not None and sampler.constraint.by_llguidance:
        from ..llama.guide import Guide

        guide = Guide(model, sampler.constraint)
    state = BranchState(
        name=name,
        seq_id=seq_id,
        prompt_tokens=prompt_tokens,
        n_predict=n_predict,
        sampler=make_sampler(sampler, model),
        model=model,
        guide=guide,
        pos=prefix_len,
        stop=stop,
        on_token=on_token,
        keep_logits=keep_logits,
        on_row=on_row,
    )
    state.t_start_ns = time.perf_counter_ns()
    return state
