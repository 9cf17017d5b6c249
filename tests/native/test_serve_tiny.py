"""`swarmkv serve` on a tiny model through the official `openai` client: the endpoints, prefix
reuse, exactness under load, and the cells coming back after requests end or disconnect."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path

import httpx
import openai
import pytest

from support.serving import Served, serve_in_thread, tiny_args

DOC = "SwarmKV prefills a shared document once and fans its state out to many branches. " * 8


def _model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def _complete(client: openai.OpenAI, prompt: str, **kw: object) -> openai.types.Completion:
    return client.completions.create(
        model=_model(client),
        prompt=prompt,
        max_tokens=kw.pop("max_tokens", 12),
        temperature=kw.pop("temperature", 0),
        **kw,  # type: ignore[arg-type]
    )


def _audit(served: Served) -> list[str]:
    return served.app.state.runtime.audit()


def test_completion_stream_and_usage_agree(client: openai.OpenAI, served: Served) -> None:
    whole = _complete(client, DOC + "Question one:", logprobs=3)
    choice = whole.choices[0]
    assert whole.system_fingerprint and whole.system_fingerprint.endswith("-exact")
    assert whole.usage is not None and whole.usage.completion_tokens == 12
    assert choice.finish_reason == "length" and choice.logprobs is not None
    assert len(choice.logprobs.token_logprobs) == 12
    assert all(len(top) == 3 for top in choice.logprobs.top_logprobs)
    chunks = list(
        client.completions.create(
            model=_model(client),
            prompt=DOC + "Question one:",
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
    assert _audit(served) == []


def test_the_next_turn_reuses_the_whole_history(client: openai.OpenAI) -> None:
    first = _complete(client, DOC + "Turn A:")
    again = _complete(client, DOC + "Turn A:" + first.choices[0].text + " and then")
    assert first.usage is not None and again.usage is not None
    details = again.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens is not None
    # everything but the seam where the new text was tokenized together with the old
    assert details.cached_tokens >= first.usage.prompt_tokens


def test_same_answer_alone_among_many_and_from_the_cache(tiny_model_path: Path) -> None:
    """The exactness promise: one request's tokens and logprobs, byte for byte, cold on a
    fresh server, among 11 other concurrent requests, and again from the prefix cache."""
    argv = ["-m", str(tiny_model_path), "-c", "4096", "-t", "2", "--max-live", "12"]
    prompt = DOC + "The one question:"
    with serve_in_thread(argv) as s:
        c = openai.OpenAI(base_url=s.v1, api_key="x", max_retries=0)
        cold = _complete(c, prompt, logprobs=2).model_dump_json()
    with serve_in_thread(argv) as s:
        model = _model(openai.OpenAI(base_url=s.v1, api_key="x"))

        async def many() -> list[str]:
            # closed on this loop (a client left open is closed later, on a closed loop)
            async with openai.AsyncOpenAI(base_url=s.v1, api_key="x", max_retries=0) as ac:
                reqs = [
                    ac.completions.create(
                        model=model, prompt=p, max_tokens=12, temperature=0, logprobs=2
                    )
                    for p in [DOC + f"Other question {i}:" for i in range(11)] + [prompt]
                ]
                return [r.model_dump_json() for r in await asyncio.gather(*reqs)]

        crowd = asyncio.run(many())[-1]
        c = openai.OpenAI(base_url=s.v1, api_key="x", max_retries=0)
        cached = _complete(c, prompt, logprobs=2)
        assert cached.usage is not None and cached.usage.prompt_tokens_details is not None
        assert cached.usage.prompt_tokens_details.cached_tokens
        cached_json = cached.model_dump_json()

    def answer(js: str) -> tuple[object, object]:
        r = openai.types.Completion.model_validate_json(js)
        return r.choices[0].text, r.choices[0].logprobs

    assert answer(cold) == answer(crowd) == answer(cached_json)


def test_n_choices_prefill_the_prompt_once(client: openai.OpenAI, served: Served) -> None:
    before = served.status()
    prompt = DOC + "Fan out over a brand new prompt, seven ways:"
    r = _complete(client, prompt, n=4, temperature=0.8, seed=7)
    after = served.status()
    assert len(r.choices) == 4 and len({c.index for c in r.choices}) == 4
    assert r.usage is not None
    computed = after["prompt_tokens_computed"] - before["prompt_tokens_computed"]
    reused = r.usage.prompt_tokens_details
    assert reused is not None and reused.cached_tokens is not None
    # the first choice computes what the cache lacks; the other three only the last token
    assert computed == r.usage.prompt_tokens - reused.cached_tokens + 3


def test_chat_with_logprobs_and_streaming(client: openai.OpenAI) -> None:
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    r = client.chat.completions.create(
        model=_model(client),
        messages=msgs,
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = r.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == r.usage.completion_tokens  # type: ignore[union-attr]
    assert all(len(t.top_logprobs) == 2 for t in content)
    streamed = client.chat.completions.create(
        model=_model(client), messages=msgs, max_tokens=6, temperature=0, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == r.choices[0].message.content


def test_stop_strings_never_reach_the_client(client: openai.OpenAI) -> None:
    free = _complete(client, DOC + "Stop test:", max_tokens=16).choices[0].text
    stop = free[3:6]
    assert stop.strip(), free
    cut = _complete(client, DOC + "Stop test:", max_tokens=16, stop=[stop])
    assert cut.choices[0].text == free[: free.find(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = client.completions.create(
        model=_model(client),
        prompt=DOC + "Stop test:",
        max_tokens=16,
        temperature=0,
        stop=[stop],
        stream=True,
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == cut.choices[0].text


def _post(served: Served, path: str, **kw: object) -> httpx.Response:
    return httpx.post(served.v1 + path, timeout=30, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": 5}, "prompt"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "n": 17}, "n"),
        ({"prompt": "x", "logprobs": 21}, "logprobs"),
        ({"prompt": "x", "temperature": "hot"}, "temperature"),
        ({"prompt": "x", "max_tokens": "3"}, "max_tokens"),  # strict: no coercion
        ({"prompt": "x", "stream": "true"}, "stream"),
        ({"prompt": "x", "model": "gpt-9"}, "model"),
        ({"prompt": [99999999]}, "prompt"),
    ],
)
def test_bad_requests_are_openai_shaped_400s(served: Served, body: dict, param: str) -> None:
    r = _post(served, "/completions", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] is not None and err["param"].startswith(param), err


def test_malformed_json_context_length_and_size_limits(served: Served) -> None:
    r = _post(
        served, "/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "invalid_json" and err["param"] is None, err
    assert "malformed JSON" in err["message"], err
    r = _post(served, "/completions", json={"prompt": DOC * 30, "max_tokens": 10})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = _post(served, "/completions", content=b"x" * (9 << 20))
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    r = httpx.get(served.base + "/nowhere")
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.get(served.v1 + "/completions")  # the wrong method: 405 says which are right
    assert r.status_code == 405 and r.headers["allow"] == "POST", r.headers


def test_api_keys_and_isolation_between_them(tiny_model_path: Path) -> None:
    argv = tiny_args(
        tiny_model_path,
        "--api-key",
        "alice-key-1",
        "--api-key",
        "bob-key-22",
        "--prefix-scope",
        "key",
    )
    with serve_in_thread(argv) as s:
        assert _post(s, "/completions", json={"prompt": "x"}).status_code == 401
        bad = {"Authorization": "Bearer wrong-key-0"}
        r = _post(s, "/completions", json={"prompt": "x"}, headers=bad)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        alice = openai.OpenAI(base_url=s.v1, api_key="alice-key-1", max_retries=0)
        bob = openai.OpenAI(base_url=s.v1, api_key="bob-key-22", max_retries=0)
        first = _complete(alice, DOC + "A:")
        second_alice = _complete(alice, DOC + "B:")
        bob_r = _complete(bob, DOC + "B:")
        cached = [
            r.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
            for r in (first, second_alice, bob_r)
        ]
        assert cached[0] == 0 and cached[1] > 0 and cached[2] == 0, cached
        assert second_alice.choices[0].text == bob_r.choices[0].text  # same answer, own cells
        assert s.status("alice-key-1")["prefix_scope"] == "key"


def test_a_full_queue_answers_429_with_retry_after(tiny_model_path: Path) -> None:
    argv = tiny_args(tiny_model_path, "--max-live", "1", "--max-queue", "1")
    with serve_in_thread(argv) as s:
        body = {"prompt": DOC, "max_tokens": 200, "temperature": 0}

        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=120) as ac:
                return await asyncio.gather(
                    *(ac.post(s.v1 + "/completions", json=body) for _ in range(6))
                )

        codes = [r.status_code for r in asyncio.run(burst())]
        assert 429 in codes and 200 in codes, codes
        r429 = next(r for r in asyncio.run(burst()) if r.status_code == 429)
        assert r429.headers["retry-after"] == "1"
        assert r429.json()["error"]["type"] == "rate_limit_error"


def test_disconnects_mid_stream_give_every_cell_back(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    """Clients that drop a request at a random point (a stream after 1-8 events, or a plain
    request by timing out): their branches are cancelled and the cells in use return to what
    they were (llama.cpp's cells audited against the tree), with nothing logged as an error."""
    import random

    from support.scale import scaled

    rt = served.app.state.runtime
    rng = random.Random(25)
    prompts = [DOC + f"Disconnect {i}:" for i in range(scaled(100, floor=20))]
    # warm: each prompt's own run resident once, so the loop itself adds nothing
    for p in prompts[:1]:
        httpx.post(served.v1 + "/completions", json={"prompt": p, "max_tokens": 1}, timeout=60)
    idle_before = rt.idle_cells
    with httpx.Client(timeout=60) as hc:
        for p in prompts:
            body = {"prompt": p, "max_tokens": 100, "temperature": 0}
            if rng.random() < 0.2:  # a plain request the client gives up on
                # 1000 tokens take the tiny model about 1 s, well past the timeout (100 took
                # about 0.11 s on a fast machine, within reach of a 0.1 s timeout)
                long = {**body, "max_tokens": 1000}
                with pytest.raises(httpx.ReadTimeout):
                    hc.post(served.v1 + "/completions", json=long, timeout=rng.uniform(0.01, 0.1))
                continue
            after = rng.randint(1, 8)
            with hc.stream("POST", served.v1 + "/completions", json={**body, "stream": True}) as r:
                for n, _line in enumerate(r.iter_lines()):
                    if n >= after:
                        break
    _wait(lambda: rt.status()["live"] == 0)
    assert rt.status()["queued"] == 0
    assert _audit(served) == []
    # cancelled requests keep nothing: only the warm-up's resident run differs, once
    assert rt.idle_cells == idle_before
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


def test_tokens_per_s_counts_a_stream_while_it_runs(served: Served) -> None:
    """The status page's tokens/s counts tokens as they come, not when a request ends."""
    rt = served.app.state.runtime
    finished = rt.status()["finished"]
    body = {"prompt": DOC + "Counting:", "max_tokens": 400, "stream": True, "temperature": 0}
    with (
        httpx.Client(timeout=60) as hc,
        hc.stream("POST", served.v1 + "/completions", json=body) as r,
    ):
        lines = r.iter_lines()
        for _ in range(6):
            next(lines)
        st = rt.status()
    assert st["finished"] == finished and st["tokens_per_s"] > 0, st
    _wait(lambda: rt.status()["live"] == 0)  # the closed stream's branch cancelled


def _wait(cond: object, timeout_s: float = 30) -> None:
    ev = threading.Event()
    for _ in range(int(timeout_s / 0.05)):
        if cond():  # type: ignore[operator]
            return
        ev.wait(0.05)
    raise AssertionError("condition not reached")


def test_a_failed_decode_fails_only_its_requests(served: Served, client: openai.OpenAI) -> None:
    rt = served.app.state.runtime
    real = rt.engine.decode
    calls = {"n": 0}

    def flaky(batch: object) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected decode failure")
        real(batch)

    rt.engine.decode = flaky
    try:
        r = _post(served, "/completions", json={"prompt": DOC + "Doomed:", "max_tokens": 4})
    finally:
        rt.engine.decode = real
    assert r.status_code == 500 and "request id" in r.json()["error"]["message"]
    assert "Traceback" not in r.text
    ok = _complete(client, DOC + "Fine:")
    assert ok.choices[0].finish_reason == "length"
    assert _audit(served) == []


def test_a_document_too_long_to_sit_beside_the_last_keeps_only_the_shared_start(
    tiny_model_path: Path,
) -> None:
    """A context with room for one document at a time: the second request (the same system
    prompt, another document) takes the first's idle sequence over, cut after the prompt
    they share, instead of being refused; its answer equals the same request on a fresh
    server."""
    system = "Read the document below and answer the question that follows it. " * 2
    doc_a = " ".join(f"alpha{i}" for i in range(85))
    doc_b = " ".join(f"beta{i}" for i in range(85))
    second = system + doc_b + " Question: what comes first?"
    argv = ["-m", str(tiny_model_path), "-c", "512", "-t", "2", "--max-live", "2"]
    with serve_in_thread(argv) as s:
        c = openai.OpenAI(base_url=s.v1, api_key="x", max_retries=0)
        first = _complete(c, system + doc_a + " Question: what comes first?")
        assert first.usage is not None and first.usage.prompt_tokens * 2 > 512
        after = _complete(c, second)
        assert after.usage is not None and after.usage.prompt_tokens_details is not None
        shared = after.usage.prompt_tokens_details.cached_tokens
        assert shared is not None and 10 < shared < 40  # the system prompt, not the document
        assert s.app.state.runtime.status()["evictions"] == 1
        assert _audit(s) == []
    with serve_in_thread(argv) as s:
        c = openai.OpenAI(base_url=s.v1, api_key="x", max_retries=0)
        fresh = _complete(c, second)
    assert after.choices[0].text == fresh.choices[0].text
