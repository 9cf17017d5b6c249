"""`swarmkv bench --serve`: agents through the official `openai` async client, on the same
seeded Poisson arrivals, against `swarmkv serve` and llama-server (`-np 16 --kv-unified`, and
`-np 1` with its prompt cache), every server a fresh process on 127.0.0.1.

Each agent sends the shared head (the 3501-token document) + its own question, streaming,
temperature 0. Before the clock starts every server gets the head once (max_tokens 1): peers
at their best, with warmed caches. Per agent, on the client's clock from its arrival: time to
first token (the first chunk carrying text), the gaps between chunks, completion, and the
server's `cached_tokens` where it reports it. After the load, every SwarmKV answer is sent
again alone, and must be the same text (the exactness promise under load).

Kernels match: SwarmKV's default is batch-invariant, so the peers run with
LLAMA_BATCH_INVARIANT=1 and --no-repack (plain against plain with --no-exact).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from swarmkv.errors import ConfigError

from .metrics import spread
from .peer_server import LlamaServer, ServerConfig, find_llama_server, log, size_n_ctx
from .probe_words import PROBE_WORDS, probe_question
from .swarm_arrivals import Arrival, poisson_arrivals

PEERS = {"server-np16-unified": (16, True), "server-np1": (1, False)}


@dataclass
class Agent:
    """One agent's request as its client saw it (ms from its arrival)."""

    index: int
    text: str = ""
    ttft_ms: float | None = None
    gaps_ms: list[float] = field(default_factory=list)
    done_ms: float | None = None
    completion_tokens: int = 0
    cached_tokens: int | None = None
    error: str | None = None


async def _one(client: Any, model: str, prompt: str, n: int, t_arrive: float) -> Agent:
    a = Agent(-1)
    stamps: list[float] = []
    try:
        stream = await client.completions.create(
            model=model,
            prompt=prompt,
            max_tokens=n,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].text:
                stamps.append(time.perf_counter())
                a.text += chunk.choices[0].text
            if chunk.usage is not None:
                a.completion_tokens = chunk.usage.completion_tokens
                details = chunk.usage.prompt_tokens_details
                a.cached_tokens = details.cached_tokens if details is not None else None
    except Exception as exc:  # recorded: the run counts errors, it does not stop
        a.error = f"{type(exc).__name__}: {exc}"
        return a
    end = time.perf_counter()
    if stamps:
        a.ttft_ms = (stamps[0] - t_arrive) * 1e3
        a.gaps_ms = [(b - x) * 1e3 for x, b in itertools.pairwise(stamps)]
    a.done_ms = (end - t_arrive) * 1e3
    a.completion_tokens = a.completion_tokens or len(stamps)
    return a


async def replay_agents(
    v1: str, head: str, arrivals: Sequence[Arrival], n_predict: int
) -> tuple[list[Agent], float]:
    """Every arrival at its time, each its own task; returns the agents and the wall time
    from the first arrival to the last token (s)."""
    import openai

    client = openai.AsyncOpenAI(base_url=v1, api_key="bench", max_retries=0, timeout=3600)
    model = (await client.models.list()).data[0].id
    t0 = time.perf_counter() + 0.2

    async def agent(arr: Arrival) -> Agent:
        t = t0 + arr.t_s
        await asyncio.sleep(max(0.0, t - time.perf_counter()))
        got = await _one(client, model, head + arr.prompt, n_predict, t)
        got.index = arr.index
        return got

    agents = await asyncio.gather(*(agent(a) for a in arrivals))
    last = max((a.done_ms or 0) / 1e3 + arrivals[a.index].t_s for a in agents)
    await client.close()
    return list(agents), last - arrivals[0].t_s


async def alone(v1: str, head: str, arrivals: Sequence[Arrival], n_predict: int) -> list[str]:
    """Each request again, one at a time: the answer it gets alone."""
    import openai

    client = openai.AsyncOpenAI(base_url=v1, api_key="bench", max_retries=0, timeout=600)
    model = (await client.models.list()).data[0].id
    out = []
    for arr in arrivals:
        r = await client.completions.create(
            model=model, prompt=head + arr.prompt, max_tokens=n_predict, temperature=0
        )
        out.append(r.choices[0].text)
    await client.close()
    return out


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (linear interpolation between ranks), None for no values."""
    vals = sorted(values)
    if not vals:
        return None
    k = (len(vals) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (k - lo)


def in_flight(agents: Sequence[Agent], arrivals: Sequence[Arrival]) -> dict[str, float]:
    """Requests in flight (arrived, last token not yet received), on the client's clock:
    the time-weighted mean from the first arrival to the last answer, and the most at once.
    The same for every system, so it says what load each one was under."""
    events: list[tuple[float, int]] = []
    for a in agents:
        if a.done_ms is not None:
            start = arrivals[a.index].t_s
            events += [(start, 1), (start + a.done_ms / 1e3, -1)]
    if not events:
        return {"mean": 0.0, "max": 0.0}
    events.sort()
    area, now, depth, most = 0.0, events[0][0], 0, 0
    for t, step in events:
        area += depth * (t - now)
        now, depth = t, depth + step
        most = max(most, depth)
    span = events[-1][0] - events[0][0]
    return {"mean": area / span if span > 0 else float(most), "max": float(most)}


def summarize(agents: Sequence[Agent], wall_s: float) -> dict[str, Any]:
    """p50/p95/p99 of time to first token and gaps, tokens/s over the wall time, errors."""
    ok = [a for a in agents if a.error is None and a.ttft_ms is not None]
    ttft = [a.ttft_ms for a in ok if a.ttft_ms is not None]
    gaps = [g for a in ok for g in a.gaps_ms]
    tokens = sum(a.completion_tokens for a in ok)
    return {
        "ttft_ms": {f"p{q}": percentile(ttft, q) for q in (50, 95, 99)},
        "itl_ms": {f"p{q}": percentile(gaps, q) for q in (50, 95, 99)},
        "tokens": tokens,
        "wall_s": wall_s,
        "tokens_per_s": tokens / wall_s if wall_s > 0 else None,
        "errors": len(agents) - len(ok),
        "cached_tokens_mean": statistics.fmean(
            [a.cached_tokens for a in ok if a.cached_tokens is not None] or [0]
        ),
    }


@dataclass(frozen=True)
class ServeBenchOptions:
    """What `swarmkv bench --serve` runs."""

    model: Path
    head: str
    head_tokens: int
    agents: int = 50
    rate: float = 5.0
    n_predict: int = 32
    threads: int = 2
    seeds: tuple[int, ...] = (0, 1, 2)
    peers: tuple[str, ...] = tuple(PEERS)
    llama_server: Path | None = None
    probes: int = len(PROBE_WORDS) - 1  # the overhead probe's, after its warm-up


def _swarmkv_server(opts: ServeBenchOptions, n_ctx: int) -> Any:
    from .serve_process import ServeProcess

    return ServeProcess(
        [
            "-m",
            str(opts.model),
            "-c",
            str(n_ctx),
            "-t",
            str(opts.threads),
            "--max-live",
            "16",
            "--max-queue",
            str(max(256, opts.agents)),
        ],
    )


def _warm(v1: str, head: str) -> None:
    import openai

    c = openai.OpenAI(base_url=v1, api_key="bench", max_retries=0, timeout=600)
    c.completions.create(model=c.models.list().data[0].id, prompt=head, max_tokens=1, temperature=0)


def run_system(name: str, opts: ServeBenchOptions, arrivals: list[Arrival]) -> dict[str, Any]:
    """One system, fresh, warmed, then the arrivals; SwarmKV's answers checked alone too."""
    per = opts.head_tokens + 64 + opts.n_predict
    if name == "swarmkv":
        n_ctx = opts.head_tokens + 16 * (64 + opts.n_predict) + 1024
        ctx: Any = _swarmkv_server(opts, n_ctx)
    else:
        n_parallel, unified = PEERS[name]
        assert opts.llama_server is not None
        n_ctx = size_n_ctx(per, opts.n_predict, n_parallel, kv_unified=unified)
        ctx = LlamaServer(
            opts.llama_server,
            ServerConfig(
                opts.model,
                n_ctx,
                n_parallel,
                opts.threads,
                512,
                unified,
                swa_full=True,
                flash_attn="on",
                batch_invariant=True,
            ),
        )
    with ctx as server:
        v1 = server.base_url + "/v1"
        _warm(v1, opts.head)
        agents, wall = asyncio.run(replay_agents(v1, opts.head, arrivals, opts.n_predict))
        out = {
            "system": name,
            "n_ctx": n_ctx,
            **summarize(agents, wall),
            "in_flight": in_flight(agents, arrivals),
            "agents": [asdict(a) for a in agents],
        }
        if name == "swarmkv":
            solo = asyncio.run(alone(v1, opts.head, arrivals, opts.n_predict))
            same = [a.text == s for a, s in zip(agents, solo, strict=True) if a.error is None]
            out["identical_to_alone"] = sum(same)
            out["compared"] = len(same)
    log.info("%s: %s", name, {k: v for k, v in out.items() if k != "agents"})
    return out


def overhead(opts: ServeBenchOptions) -> dict[str, Any]:
    """HTTP's cost: one request's time to first token through `swarmkv serve` (the client's
    clock, streaming) against the in-process Swarm's activation_ms (submit to first token),
    the shared head cached in both, each probe a new question (its tokens prefilled),
    alternating one by one after a warm-up probe each. The server's own time to first token
    of each probe (its /metrics histogram's sum, read before and after) splits the difference:
    the client's time less the server's is what HTTP, JSON and tokenizing cost; the server's
    less the Swarm's is the engines' difference, which varies probe by probe either way."""
    import openai

    from swarmkv import Swarm

    reps = opts.probes
    if not 1 <= reps < len(PROBE_WORDS):  # a word of its own for each, the warm-up's too
        raise ConfigError(f"probes must be in [1, {len(PROBE_WORDS) - 1}], not {reps}")
    n_ctx = opts.head_tokens + 1024
    args = ["-m", str(opts.model), "-c", str(n_ctx), "-t", str(opts.threads), "--max-live", "1"]
    from .serve_process import ServeProcess

    with (
        ServeProcess(args) as server,
        Swarm(opts.model, n_ctx=n_ctx, max_live=1, max_docs=1, n_threads=opts.threads) as swarm,
    ):
        v1 = server.base_url + "/v1"
        swarm.add_document("head", text=opts.head)
        _warm(v1, opts.head)
        client = openai.OpenAI(base_url=v1, api_key="bench", max_retries=0, timeout=600)
        model = client.models.list().data[0].id
        in_process, http, inside = [], [], []
        for i in range(reps + 1):
            q = probe_question(i)
            r = swarm.submit("head", q, n_predict=1).result(timeout=600)
            time.sleep(0.2)
            before = _server_ttft_sum_s(server.base_url)
            t = time.perf_counter()
            stream = client.completions.create(
                model=model, prompt=opts.head + q, max_tokens=1, temperature=0, stream=True
            )
            first = math.nan
            for chunk in stream:
                if math.isnan(first) and chunk.choices:
                    first = (time.perf_counter() - t) * 1e3
            served = (_server_ttft_sum_s(server.base_url) - before) * 1e3
            time.sleep(0.2)
            if i:  # the first probe of each is a warm-up
                in_process.append(r.activation_ms)
                http.append(first)
                inside.append(served)
    diffs = [h - s for h, s in zip(http, in_process, strict=True)]
    gaps = [h - s for h, s in zip(http, inside, strict=True)]
    return {
        "reps": reps,
        "swarm_activation_ms": in_process,
        "serve_ttft_ms": http,
        "server_internal_ttft_ms": inside,
        "median_swarm_ms": statistics.median(in_process),
        "median_serve_ms": statistics.median(http),
        "median_overhead_ms": statistics.median(diffs),
        "overhead_range_ms": [min(diffs), max(diffs)],
        "median_http_gap_ms": statistics.median(gaps),
        "http_gap_range_ms": [min(gaps), max(gaps)],
        "tokenize_ms": tokenize_cost(opts, reps),
    }


def _server_ttft_sum_s(base_url: str) -> float:
    """swarmkv_time_to_first_token_seconds_sum from the server's /metrics."""
    import httpx

    for line in httpx.get(base_url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("swarmkv_time_to_first_token_seconds_sum "):
            return float(line.split()[1])
    raise RuntimeError("the server's /metrics has no swarmkv_time_to_first_token_seconds_sum")


def tokenize_cost(opts: ServeBenchOptions, reps: int) -> dict[str, list[float]]:
    """What one part of that overhead is, timed in this process after the probes: tokenizing
    each probe's prompt (head + its question), which the server must do (the client sends text)
    and the Swarm does not (its document is tokenized once, when added). "whole_ms":
    llama_tokenize of the whole text; "server_ms": what the server does, PrefixTokenizer with
    the warm-ups' prompts remembered (only the text after the shared head is tokenized)."""
    from swarmkv.llama.model import Model
    from swarmkv.llama.prefix_tokens import PrefixTokenizer

    whole, server = [], []
    with Model(opts.model) as model:
        tokenizer = PrefixTokenizer(model)
        for text in (opts.head, opts.head + probe_question(0)):  # the server's warm-ups
            tokenizer.tokenize(text)
        for i in range(1, reps + 1):  # the probes measured
            prompt = opts.head + probe_question(i)
            t = time.perf_counter()
            expected = model.tokenize(prompt, add_special=True, parse_special=True)
            t1 = time.perf_counter()
            got = tokenizer.tokenize(prompt)
            t2 = time.perf_counter()
            if got != expected:  # never: the property tests hold it to llama_tokenize's
                raise AssertionError(f"PrefixTokenizer differs from llama_tokenize on probe {i}")
            whole.append((t1 - t) * 1e3)
            server.append((t2 - t1) * 1e3)
    return {"whole_ms": whole, "server_ms": server}


def _setup(opts: ServeBenchOptions) -> dict[str, Any]:
    """The options a result records (the head's text aside: its length is there)."""
    return {k: v for k, v in asdict(opts).items() if k != "head"}


def run_overhead_only(opts: ServeBenchOptions) -> dict[str, Any]:
    """Only the HTTP overhead probe (`--overhead-only`), once per seed (--trials), each with a
    fresh server and Swarm; the summary is each figure's median [min, max] over the trials."""
    trials = [overhead(opts) for _ in opts.seeds]
    keys = ("median_overhead_ms", "median_http_gap_ms", "median_swarm_ms", "median_serve_ms")
    summary = {k: spread([t[k] for t in trials]) for k in keys}
    for kind in ("server_ms", "whole_ms"):
        summary[f"tokenize_{kind}"] = spread(
            [statistics.median(t["tokenize_ms"][kind]) for t in trials]
        )
    return {
        "setup": _setup(opts),
        "http_overhead_trials": trials,
        "summary": summary,
    }


def run_serve_bench(opts: ServeBenchOptions) -> dict[str, Any]:
    """Every seed: the same arrivals against each system in turn (SwarmKV first); then the
    HTTP overhead probe."""
    trials = []
    for seed in opts.seeds:
        arrivals = poisson_arrivals(opts.rate, opts.agents, opts.n_predict, opts.n_predict, seed)
        systems = ["swarmkv", *opts.peers] if opts.llama_server else ["swarmkv"]
        trials.append({"seed": seed, "systems": [run_system(s, opts, arrivals) for s in systems]})
    return {
        "setup": _setup(opts),
        "trials": trials,
        "targets": targets(trials),
        "summary": summary(trials),
        "http_overhead": overhead(opts),
    }


def summary(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """Per system, median [min, max] over the trials of p50/p99 time to first token and
    tokens/s, and the target ratios likewise."""
    out: dict[str, Any] = {}
    names = [s["system"] for s in trials[0]["systems"]]
    for name in names:
        runs = [next(s for s in t["systems"] if s["system"] == name) for t in trials]
        out[name] = {
            "ttft_p50_ms": spread([r["ttft_ms"]["p50"] for r in runs]),
            "ttft_p99_ms": spread([r["ttft_ms"]["p99"] for r in runs]),
            "itl_p50_ms": spread([r["itl_ms"]["p50"] for r in runs]),
            "tokens_per_s": spread([r["tokens_per_s"] for r in runs]),
            "in_flight_mean": spread([r["in_flight"]["mean"] for r in runs]),
            "errors": sum(r["errors"] for r in runs),
        }
    t = targets(trials)
    ratios: dict[str, Any] = {}
    for peer in names[1:]:
        ratios[f"p99_ttft_{peer}_over_swarmkv"] = spread([r[peer] for r in t["p99_ttft_ratio"]])
    if t["tokens_per_s_ratio"]:
        ratios["tokens_per_s_swarmkv_over_best_peer"] = spread(t["tokens_per_s_ratio"])
    out["ratios"] = ratios
    return out


def targets(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets per trial: p99 TTFT of each peer over SwarmKV's (>= 5x), SwarmKV's
    tokens/s over the better peer's (>= 1.5x), zero errors, every answer as alone."""
    out: dict[str, list[Any]] = {
        "p99_ttft_ratio": [],
        "tokens_per_s_ratio": [],
        "errors": [],
        "identical": [],
    }
    for t in trials:
        by = {s["system"]: s for s in t["systems"]}
        mine = by["swarmkv"]
        peers = [s for n, s in by.items() if n != "swarmkv"]
        out["errors"].append(sum(s["errors"] for s in t["systems"]))
        out["identical"].append(f"{mine['identical_to_alone']}/{mine['compared']}")
        if peers:
            out["p99_ttft_ratio"].append(
                {s["system"]: s["ttft_ms"]["p99"] / mine["ttft_ms"]["p99"] for s in peers}
            )
            best = max(s["tokens_per_s"] for s in peers)
            out["tokens_per_s_ratio"].append(mine["tokens_per_s"] / best)
    return out


def default_llama_server() -> Path | None:
    """The llama-server the bench finds ($SWARMKV_LLAMA_SERVER or the repository's build)."""
    return find_llama_server()
