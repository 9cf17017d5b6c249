"""How one step's llama_batch is filled: the engine's packing policies. Plain Python over the
engine's lists and a batch; they decide rows, never decode.

| packing    | one step decodes                                                              |
|------------|-------------------------------------------------------------------------------|
| mixed      | a row per generating branch, then document chunks (half the budget left when  |
|            | prompts wait), then prompt tokens split by the scheduling policy              |
| phased     | a document chunk alone; else prompt tokens in admission order; else one row   |
|            | per generating branch (a fork wave's shapes)                                   |
| per_branch | a document chunk alone; else one branch's prompt chunk; else one branch's      |
|            | next token, round robin (every shape a lone branch's: the baseline's)          |

With batch-invariant kernels every packing gives the same tokens and logits; without them,
`phased` and `per_branch` keep the shapes the fork waves had, and `per_branch` the baseline's.
A document chunk never crosses one of its bounds (watermarks are exact).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .work import Document, Request

if TYPE_CHECKING:
    from .core import Engine


@dataclass
class StepPlan:
    """The rows of one step: document spans, prompt spans (with the row of a prompt's last
    token, whose logits are sampled) and generation spans (a branch's tokens not yet decoded:
    its last sampled token, and the tokens its grammar forced after it; the row of the last,
    None when the span stops short of it)."""

    docs: list[tuple[Document, int, int]] = field(default_factory=list)
    prompts: list[tuple[Request, int, int | None]] = field(default_factory=list)
    gens: list[tuple[Request, int, int | None]] = field(default_factory=list)
    n_tokens: int = 0

    @property
    def empty(self) -> bool:
        """Whether the step has no row at all."""
        return self.n_tokens == 0


def add_doc(plan: StepPlan, batch: Any, doc: Document, budget: int) -> int:
    """Add up to budget tokens of doc's next span; returns how many."""
    lo, hi = doc.next_span(budget)
    last = len(doc.tokens) - 1 if doc.logits_last else -1
    for pos in range(lo, hi):
        row = batch.add(doc.tokens[pos], pos, (doc.seq_id,), pos == last)
        if pos == last:
            doc.last_row = row
    if hi > lo:
        plan.docs.append((doc, lo, hi))
        plan.n_tokens += hi - lo
    return hi - lo


def add_prompt(plan: StepPlan, batch: Any, req: Request, n: int) -> None:
    """Add req's next n prompt tokens at its next positions; logits on the prompt's last."""
    st = req.state
    assert st is not None
    last_row = None
    for k in range(req.prompt_done, req.prompt_done + n):
        last = k == len(req.prompt) - 1
        row = batch.add(req.prompt[k], st.pos + k - req.prompt_done, (st.seq_id,), last)
        if last:
            last_row = row
    plan.prompts.append((req, n, last_row))
    plan.n_tokens += n


def add_gen(plan: StepPlan, batch: Any, req: Request, extra: int = 0) -> int:
    """Add req's undecoded tokens (at most 1 + extra) at its next positions, logits on the
    last of them; returns how many extra rows it took."""
    st = req.state
    assert st is not None
    n = min(len(st.pending), 1 + max(extra, 0))
    last_row = None
    for k in range(n):
        last = k == len(st.pending) - 1
        row = batch.add(st.pending[k], st.pos + k, (st.seq_id,), last)
        if last:
            last_row = row
    plan.gens.append((req, n, last_row))
    plan.n_tokens += n
    return n - 1


def add_gens(plan: StepPlan, batch: Any, eng: Engine) -> None:
    """A row for every generating branch, then rows for forced tokens while the budget lasts."""
    gens = [r for r in eng.live if r.generating]
    extra = eng.n_batch - len(gens)
    for req in gens:
        extra -= add_gen(plan, batch, req, extra)


def _first_doc(eng: Engine) -> Document | None:
    return next((d for d in eng.docs if d.pending), None)


def mixed(eng: Engine, batch: Any, now_s: float) -> StepPlan:
    """Everything live in one decode (the swarm's continuous batching)."""
    plan = StepPlan()
    add_gens(plan, batch, eng)
    budget = eng.n_batch - plan.n_tokens
    prefilling = [r for r in eng.live if r.prompt_left > 0]
    doc_budget = budget // 2 if prefilling else budget
    for doc in eng.docs:
        if doc.pending and doc_budget > 0:
            took = add_doc(plan, batch, doc, doc_budget)
            doc_budget -= took
            budget -= took
    for waiting, n in eng.policy.prompt_shares(prefilling, budget, now_s):
        assert isinstance(waiting, Request)
        add_prompt(plan, batch, waiting, n)
    return plan


def phased(eng: Engine, batch: Any, now_s: float) -> StepPlan:
    """A document chunk alone, else prompts (admission order), else every generating row."""
    plan = StepPlan()
    doc = _first_doc(eng)
    if doc is not None:
        add_doc(plan, batch, doc, eng.n_batch)
        return plan
    budget = eng.n_batch
    for req in eng.live:
        if req.prompt_left > 0 and budget > 0:
            n = min(req.prompt_left, budget)
            add_prompt(plan, batch, req, n)
            budget -= n
    if plan.empty:
        add_gens(plan, batch, eng)
    return plan


def per_branch(eng: Engine, batch: Any, now_s: float) -> StepPlan:
    """One unit per decode: a document chunk, one branch's prompt chunk, or one branch's
    next token (round robin over the generating branches)."""
    plan = StepPlan()
    doc = _first_doc(eng)
    if doc is not None:
        add_doc(plan, batch, doc, eng.n_batch)
        return plan
    for req in eng.live:
        if req.prompt_left > 0:
            add_prompt(plan, batch, req, min(req.prompt_left, eng.n_batch))
            return plan
    gen = [r for r in eng.live if r.generating]
    if gen:
        eng.turn = eng.turn % len(gen)
        add_gen(plan, batch, gen[eng.turn], eng.n_batch - 1)
        eng.turn += 1
    return plan


Compose = Callable[["Engine", Any, float], StepPlan]
PACKINGS: dict[str, Compose] = {"mixed": mixed, "phased": phased, "per_branch": per_branch}


def packing(name: str) -> Compose:
    """The packing of a name in PACKINGS; ConfigError naming the choices otherwise."""
    if name not in PACKINGS:
        raise ConfigError(f"unknown packing {name!r}; choose one of {', '.join(PACKINGS)}")
    return PACKINGS[name]
