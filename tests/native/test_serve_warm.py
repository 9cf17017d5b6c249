"""POST /v1/warm on one server (the tiny model): the prompt is prefilled once, and the requests
that start with it find it in the cache; bad bodies get OpenAI-shaped 400s."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from support.serving import Served, serve_in_thread, tiny_args

HEAD = "A shared system prompt that every agent of the swarm starts with, warmed early. " * 6


def _warm(served: Served, body: dict, **kw: object) -> httpx.Response:
    return httpx.post(served.v1 + "/warm", json=body, timeout=30, **kw)  # type: ignore[arg-type]


def test_a_warmed_prompt_is_computed_once_and_reused(served: Served, client: openai.OpenAI) -> None:
    first = _warm(served, {"prompt": HEAD})
    assert first.status_code == 200, first.text
    body = first.json()
    n = body["prompt_tokens"]
    assert body["object"] == "warm" and n > 50 and body["ms"] > 0
    assert body["engines"] == [{"engine": 0, "cached_tokens": 0, "computed_tokens": n}]
    # again: held already; only the last token is computed again (a request needs its logits)
    again = _warm(served, {"prompt": HEAD}).json()["engines"]
    assert again == [{"engine": 0, "cached_tokens": n - 1, "computed_tokens": 1}]
    model = client.models.list().data[0].id
    r = client.completions.create(model=model, prompt=HEAD + "Q:", max_tokens=4, temperature=0)
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    # the head's tokens, less the one or two its seam with the question retokenizes
    assert r.usage.prompt_tokens_details.cached_tokens >= n - 2
    assert served.app.state.runtime.audit() == []


def test_token_prompts_warm_too(served: Served) -> None:
    tokens = list(range(10, 60))
    first = _warm(served, {"prompt": tokens, "model": served.app.state.settings.model_id}).json()
    assert first["prompt_tokens"] == 50
    assert first["engines"][0]["computed_tokens"] + first["engines"][0]["cached_tokens"] == 50


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({}, "prompt", None),
        ({"prompt": []}, "prompt", None),
        ({"prompt": 5}, "prompt", None),
        ({"prompt": [99999999]}, "prompt", None),
        ({"prompt": "x", "model": "gpt-9"}, "model", "model_not_found"),
        ({"prompt": HEAD * 30}, "prompt", "context_length_exceeded"),
    ],
)
def test_bad_warm_bodies_are_openai_shaped_400s(
    served: Served, body: dict, param: str, code: str | None
) -> None:
    r = _warm(served, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] is not None and err["param"].startswith(param), err
    if code is not None:
        assert err["code"] == code, err


def test_warm_needs_a_key_and_stays_in_its_scope(tiny_model_path: Path) -> None:
    argv = tiny_args(tiny_model_path, "--api-key", "alice-key-1", "--api-key", "bob-key-22")
    argv += ["--prefix-scope", "key"]
    with serve_in_thread(argv) as s:
        assert _warm(s, {"prompt": HEAD}).status_code == 401
        alice = {"Authorization": "Bearer alice-key-1"}
        assert _warm(s, {"prompt": HEAD}, headers=alice).status_code == 200
        bob = openai.OpenAI(base_url=s.v1, api_key="bob-key-22", max_retries=0)
        model = bob.models.list().data[0].id
        r = bob.completions.create(model=model, prompt=HEAD + "Q:", max_tokens=2)
        # alice's warm-up is hers: bob computes the head himself
        assert r.usage is not None and r.usage.prompt_tokens_details is not None
        assert r.usage.prompt_tokens_details.cached_tokens == 0
