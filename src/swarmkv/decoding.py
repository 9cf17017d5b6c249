"""The decoding engine every handoff mode shares: chunked prefill, prompts, generation.

One code path serves one branch (host, baseline) and many branches batched in one context
(fork), so a single branch is decoded with exactly the batch shapes of the baseline.

Sequence invariants (per context):

| seq        | holds                                   | written by                    |
|------------|-----------------------------------------|-------------------------------|
| prefix seq | document tokens at positions [0, P)     | prefill_chunks                |
| branch seq | prefix [0, W) + prompt + generated      | seq_cp / restore, then decode |

A branch's prompt starts at position W (its prefix length), never at 0; each generated token
continues at the next position. Finished branches free their cells with seq_rm.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .batch import Batch, Sampler
from .context import Context
from .errors import ConfigError
from .model import Model
from .sampling import SamplerConfig, TokenCallback


@dataclass
class DecodeStats:
    """Where decode time goes, summed over a run (nanoseconds). Python overhead of a
    generation step is everything in the step but llama_decode: batch filling, sampling,
    stop checks, callbacks."""

    prompt_ns: int = 0
    prompt_decodes: int = 0
    gen_steps: int = 0
    gen_step_ns: int = 0
    gen_decode_ns: int = 0
    capture_ns: int = 0  # copying logits for fidelity checks (keep_logits): not the product's
    # host mode may decode several branch contexts at once (max_contexts > 1)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add_prompts(self, ns: int, decodes: int) -> None:
        """Add one decode_prompts call's time (nanoseconds) and decode count; thread-safe."""
        with self._lock:
            self.prompt_ns += ns
            self.prompt_decodes += decodes

    def add_step(self, step_ns: int, decode_ns: int, capture_ns: int) -> None:
        """Count one generation step and add its total, decode and capture times (ns)."""
        with self._lock:
            self.gen_steps += 1
            self.gen_decode_ns += decode_ns
            self.capture_ns += capture_ns
            self.gen_step_ns += step_ns

    def to_ms(self) -> dict[str, float]:
        """The totals in milliseconds, plus step count, time per step and Python overhead %."""
        step = self.gen_step_ns or 1
        return {
            "prompt_ms": self.prompt_ns / 1e6,
            "gen_steps": float(self.gen_steps),
            "gen_ms": self.gen_step_ns / 1e6,
            "gen_decode_ms": self.gen_decode_ns / 1e6,
            "gen_ms_per_step": self.gen_step_ns / 1e6 / max(self.gen_steps, 1),
            "python_overhead_pct": 100.0 * (self.gen_step_ns - self.gen_decode_ns) / step,
            "logit_capture_ms": self.capture_ns / 1e6,
        }


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


def prefill_chunks(
    ctx: Context,
    tokens: Sequence[int],
    seq_id: int,
    bounds: Sequence[tuple[int, int]],
    batch: Batch,
    on_chunk: Callable[[int], None] | None = None,
) -> None:
    """Decode tokens[lo:hi] for each bound at absolute positions lo..hi-1, without logits."""
    for lo, hi in bounds:
        batch.clear()
        for pos in range(lo, hi):
            batch.add(tokens[pos], pos, (seq_id,))
        ctx.decode(batch)
        if on_chunk is not None:
            on_chunk(hi)


@dataclass
class BranchState:
    """One branch being decoded: its sequence, sampler, output and stop rules."""

    name: str
    seq_id: int
    prompt_tokens: list[int]
    n_predict: int
    sampler: Sampler
    model: Model
    pos: int  # next position to decode
    stop: tuple[str, ...] = ()
    on_token: TokenCallback | None = None
    keep_logits: bool | str = False  # True: first step's logits; "all": every step's
    tokens: list[int] = field(default_factory=list)
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
    def text(self) -> str:
        """Generated text as UTF-8 (invalid bytes replaced), cut at the first stop string."""
        text = self.text_bytes.decode("utf-8", errors="replace")
        for s in self.stop:
            cut = text.find(s)
            if cut >= 0:
                text = text[:cut]
        return text

    def take(self, ctx: Context, row: int) -> None:
        """Sample from batch row `row`, record the token, and decide whether to stop."""
        if self.keep_logits == "all" or (self.keep_logits and not self.step_logits):
            t = time.perf_counter_ns()
            self.step_logits.append(ctx.logits(row).copy())
            self.capture_ns += time.perf_counter_ns() - t
        token = self.sampler.sample(ctx, row)
        if self.t_first_ns is None:
            self.t_first_ns = time.perf_counter_ns()
        if self.model.is_eog(token):
            self.stop_reason = "eog"
            return
        self.tokens.append(token)
        piece = self.model.token_to_piece(token)
        self.text_bytes += piece
        if self.on_token is not None:
            self.on_token(self.name, token, piece.decode("utf-8", errors="replace"))
        if self.stop and self._hit_stop(len(piece)):
            self.stop_reason = "stop"
        elif len(self.tokens) >= self.n_predict:
            self.stop_reason = "length"

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
) -> BranchState:
    """A branch about to decode its prompt at positions prefix_len, prefix_len+1, ..."""
    state = BranchState(
        name=name,
        seq_id=seq_id,
        prompt_tokens=prompt_tokens,
        n_predict=n_predict,
        sampler=Sampler(sampler),
        model=model,
        pos=prefix_len,
        stop=stop,
        on_token=on_token,
        keep_logits=keep_logits,
    )
    state.t_start_ns = time.perf_counter_ns()
    return state


def _take_safely(ctx: Context, state: BranchState, row: int) -> None:
    # One branch's failure (a raising callback, say) must not take the others down.
    try:
        state.take(ctx, row)
    except Exception as exc:
        state.fail(exc)
    if state.done:
        state.t_end_ns = time.perf_counter_ns()


def decode_prompts(
    ctx: Context,
    states: Sequence[BranchState],
    batch: Batch,
    packing: str = "batched",
    stats: DecodeStats | None = None,
    check_cancelled: Callable[[], None] | None = None,
) -> None:
    """Decode every branch's prompt, packed into as few batches as n_batch allows.

    Logits are requested only at each prompt's last token; that row is sampled right after
    the decode that holds it, before the next decode overwrites the logits.
    packing="per_branch" decodes each branch's prompt on its own (the baseline's shapes).
    """
    if packing == "per_branch" and len(states) > 1:
        for state in states:
            decode_prompts(ctx, [state], batch, packing, stats, check_cancelled)
        return
    t0 = time.perf_counter_ns()
    rows = [(s, k) for s in states for k in range(len(s.prompt_tokens))]
    cap = min(batch.capacity, ctx.n_batch)
    decodes = 0
    for lo in range(0, len(rows), cap):
        if check_cancelled is not None:
            check_cancelled()
        batch.clear()
        last_rows = []
        for state, k in rows[lo : lo + cap]:
            is_last = k == len(state.prompt_tokens) - 1
            row = batch.add(state.prompt_tokens[k], state.pos, (state.seq_id,), is_last)
            state.pos += 1
            if is_last:
                last_rows.append((state, row))
        ctx.decode(batch)
        for state, row in last_rows:
            _take_safely(ctx, state, row)
        decodes += 1
    if stats is not None:
        stats.add_prompts(time.perf_counter_ns() - t0, decodes)


def step_rows(batch: Batch, group: Sequence[BranchState]) -> list[tuple[BranchState, int]]:
    """Fill batch for one generation step: each branch's last token at its next position, one
    row each with logits on; returns (branch, row) pairs for take_step."""
    batch.clear()
    return [(s, batch.add(s.tokens[-1], s.pos, (s.seq_id,), True)) for s in group]


def take_step(
    ctx: Context,
    rows: Sequence[tuple[BranchState, int]],
    stats: DecodeStats | None,
    t_step_ns: int,
    decode_ns: int,
) -> None:
    """After a step's llama_decode: each branch advances and samples its next token from its
    own row; stats count the step (started at t_step_ns) with its split of times."""
    captured = sum(s.capture_ns for s, _ in rows)
    for state, row in rows:
        state.pos += 1
        _take_safely(ctx, state, row)
    if stats is not None:
        captured = sum(s.capture_ns for s, _ in rows) - captured
        stats.add_step(time.perf_counter_ns() - t_step_ns - captured, decode_ns, captured)
