"""The HTTP overhead probe of `swarmkv bench --serve`: one request's time to first token
through `swarmkv serve` against the in-process Swarm's, and what tokenizing costs of it."""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

from swarmkv.errors import ConfigError

from .metrics import spread
from .probe_words import PROBE_WORDS, probe_question


def _warm(v1: str, head: str) -> None:
    import openai

    c = openai.OpenAI(base_url=v1, api_key="bench", max_retries=0, timeout=600)
    c.completions.create(model=c.models.list().data[0].id, prompt=head, max_tokens=1, temperature=0)


def overhead(opts: Any) -> dict[str, Any]:
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


def tokenize_cost(opts: Any, reps: int) -> dict[str, list[float]]:
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


def run_overhead_only(opts: Any, setup: dict[str, Any]) -> dict[str, Any]:
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
        "setup": setup,
        "http_overhead_trials": trials,
        "summary": summary,
    }
