"""The workloads of `swarmkv bench --serve`: who sends what, and when.

A workload is a list of agents, each arriving once (seeded Poisson arrivals; the seed moves
only the arrival times, so every seed and every rate sends the same texts) and sending one or
more turns. A turn's prompt is the agent's head, then every earlier turn's question and the
answer it got, then the new question: a multi-turn agent re-sends its whole history, as agents
built on a completions API do.

| name      | heads                          | agents                       | turns |
|-----------|--------------------------------|------------------------------|-------|
| shared    | one of `head_tokens`           | `agents`, distinct questions | 1     |
| multiturn | one of `head_tokens`           | `multiturn_agents`           | `turns` |
| groups    | `groups` of `group_tokens`     | `group_agents` per head, interleaved | 1 |
| cold      | none: each agent its own text of `cold_tokens` | `agents`     | 1     |
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from swarmkv.errors import ConfigError

from .probe_words import PROBE_WORDS
from .workload import Tokenizer, document, text_document

WORKLOADS = ("shared", "multiturn", "groups", "cold")


@dataclass(frozen=True)
class Shapes:
    """The sizes of every workload (defaults: the issue's)."""

    head_tokens: int = 3501
    agents: int = 50
    multiturn_agents: int = 20
    turns: int = 4
    groups: int = 4
    group_agents: int = 12
    group_tokens: int = 2000
    cold_tokens: int = 500
    n_predict: int = 32


@dataclass(frozen=True)
class AgentPlan:
    """One agent: its head (the text every turn starts with) and one question per turn."""

    index: int
    head: str
    questions: tuple[str, ...]
    group: int = 0


@dataclass(frozen=True)
class Workload:
    """A workload's agents, and the heads a peer is warmed with before the clock starts
    (none for `cold`: there is nothing to share)."""

    name: str
    agents: tuple[AgentPlan, ...]
    heads: tuple[str, ...]
    n_predict: int

    @property
    def requests(self) -> int:
        """Requests it sends in all (agents × turns)."""
        return sum(len(a.questions) for a in self.agents)


def varied_text(seed: int) -> str:
    """A text of its own for each seed (made-up sentences from PROBE_WORDS): heads that share
    no prefix with each other, so a group's cache cannot serve another group."""
    rng = random.Random(f"head-{seed}")
    words = list(PROBE_WORDS)
    sentences = [f"Record {seed}."]
    for _ in range(800):
        a, b, c = rng.sample(words, 3)
        sentences.append(f"The {a.lower()} near the {b.lower()} watched the {c.lower()} again.")
    return " ".join(sentences)


def question(agent: int, turn: int) -> str:
    """The agent's question at a turn: distinct across agents and turns."""
    if turn == 0:
        return f"\n\nAgent {agent}, question 1: what does the text say next?\nAnswer:"
    return f"\n\nAgent {agent}, question {turn + 1}: and what comes after that?\nAnswer:"


def build(name: str, model: Tokenizer, shapes: Shapes) -> Workload:
    """The named workload's texts, cut to their token counts with the model's tokenizer."""
    if name not in WORKLOADS:
        raise ConfigError(f"unknown workload {name!r}: choose from {', '.join(WORKLOADS)}")
    s = shapes
    if name in ("shared", "multiturn"):
        head = document(model, s.head_tokens)
        count, turns = (s.agents, 1) if name == "shared" else (s.multiturn_agents, s.turns)
        agents = [AgentPlan(i, head, _turns(i, turns)) for i in range(count)]
        return Workload(name, tuple(agents), (head,), s.n_predict)
    if name == "groups":
        heads = [text_document(model, s.group_tokens, varied_text(g)) for g in range(s.groups)]
        count = s.groups * s.group_agents
        agents = [
            AgentPlan(i, heads[i % s.groups], _turns(i, 1), i % s.groups) for i in range(count)
        ]
        return Workload(name, tuple(agents), tuple(heads), s.n_predict)
    texts = [text_document(model, s.cold_tokens, varied_text(1000 + i)) for i in range(s.agents)]
    agents = [AgentPlan(i, texts[i], _turns(i, 1), i) for i in range(s.agents)]
    return Workload(name, tuple(agents), (), s.n_predict)


def _turns(agent: int, turns: int) -> tuple[str, ...]:
    return tuple(question(agent, t) for t in range(turns))


def arrival_times(count: int, rate: float, seed: int) -> list[float]:
    """Seconds from the start at which each of count agents arrives: exponential gaps of mean
    1/rate (a Poisson process); rate inf is a burst, every agent at 0."""
    if math.isinf(rate):
        return [0.0] * count
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(count):
        t += rng.expovariate(rate)
        out.append(t)
    return out
