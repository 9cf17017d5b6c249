"""The one result of a branch, whoever ran it (a pipeline mode or the swarm): its output and
where its time went, in milliseconds. Pure data, JSON-ready via to_dict."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .work import Request


def ms(ns: int) -> float:
    """Nanoseconds as milliseconds, rounded to 3 decimals (microseconds)."""
    return round(ns / 1e6, 3)


@dataclass(frozen=True)
class BranchResult:
    """What one branch produced, and where its time went (milliseconds).

    activation_ms runs from when the branch may start (a pipeline: its prefix is decoded and,
    in host mode, a context slot is free; the swarm: its arrival) to its first generated token;
    first_token_ms and end_ms from the run's start (a pipeline's run() or the swarm's start);
    queue_ms from arrival to admission and completion_ms from arrival to the last token.
    The mode-specific times are None where the mode has no such step.

    stop_reason: "eog" (an end-of-generation token), "stop" (a stop string), "length"
    (n_predict), "grammar" (a constraint that can take nothing more), "truncated" (n_predict
    reached before the constraint was complete: the text does not match it). forced_tokens:
    output tokens a constraint forced (fast-forward, not sampled); mask_ms: the constraint's
    mask time per sampled step (a share of the step's masks computed together);
    constraint_ms: all its constraint work (masks, applying them, accepting, fast-forward).
    """

    name: str
    text: str
    tokens: tuple[int, ...]
    stop_reason: str
    prompt_tokens: int
    activation_ms: float
    prompt: str = ""  # a pipeline branch's prompt template
    doc: str = ""  # the document it read
    prefix_tokens: int = 0  # document tokens it read
    decode_ms: float = 0.0  # prompt + generation
    first_token_ms: float = 0.0
    end_ms: float = 0.0
    restore_ms: float | None = None  # host: llama_state_seq_set_data; fork: seq_cp
    fork_copy_ms: float | None = None  # host: copy-on-fork of the snapshot bytes
    prefill_ms: float | None = None  # baseline: this branch's own document prefill
    wait_ms: float | None = None  # host: input ready, waiting for a context slot (policy)
    priority: int = 0
    arrival_s: float = 0.0  # the swarm: seconds since it started
    queue_ms: float = 0.0
    completion_ms: float = 0.0
    inter_token_ms: tuple[float, ...] = field(default=(), repr=False)
    forced_tokens: int = 0
    mask_ms: tuple[float, ...] = field(default=(), repr=False)
    constraint_ms: float = 0.0
    step_logits: tuple[np.ndarray, ...] = field(default=(), compare=False, repr=False)

    @property
    def first_logits(self) -> np.ndarray | None:
        """Logits of the first generated step (kept with keep_logits), or None."""
        return self.step_logits[0] if self.step_logits else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields of the result; step_logits are left out."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "step_logits":
                continue
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


def result_of(
    req: Request, *, ready_ns: int, t0_ns: int, doc: str = "", prompt: str = "", **timings: Any
) -> BranchResult:
    """A finished request's result: raises its error if it failed. ready_ns: when it could
    start; t0_ns: the run's start; timings: the mode-specific fields (restore_ms, ...)."""
    st = req.state
    error = req.error if st is None else st.error
    if error is not None:
        raise error
    assert st is not None and req.admit_ns is not None
    first, end = st.span_ns()
    return BranchResult(
        name=req.name,
        text=st.text,
        tokens=tuple(st.tokens),
        stop_reason=st.stop_reason or "error",
        prompt_tokens=len(req.prompt),
        activation_ms=ms(first - ready_ns),
        prompt=prompt,
        doc=doc,
        prefix_tokens=req.prefix_len,
        decode_ms=ms(end - req.admit_ns),
        first_token_ms=ms(first - t0_ns),
        end_ms=ms(end - t0_ns),
        priority=req.priority,
        arrival_s=req.arrival_s,
        queue_ms=ms(req.admit_ns - req.arrival_ns),
        completion_ms=ms(end - req.arrival_ns),
        inter_token_ms=req.inter_token_ms(),
        forced_tokens=st.guide.forced if st.guide is not None else 0,
        mask_ms=tuple(ms(n) for n in st.guide.mask_ns) if st.guide is not None else (),
        constraint_ms=ms(st.guide.constraint_ns) if st.guide is not None else 0.0,
        step_logits=tuple(st.step_logits),
        **timings,
    )
