"""The served promise on the default model: a request's tokens and logprobs are the same
bytes whether it runs alone on a cold server (its text tokenized whole), among 49 concurrent
requests over a shared 3501-token head (their texts tokenized after it: PrefixTokenizer), or
from the prefix cache (official `openai` clients, sync and async)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import openai
import pytest

import swarmkv as sk
from swarmkv_bench.workload import document, prompts_for

from support.serving import serve_process

pytestmark = [pytest.mark.slow, pytest.mark.serve]
ARGS = ["-c", "8192", "-t", "2", "--max-live", "16"]


def _answer(r: openai.types.Completion) -> tuple[str, object]:
    c = r.choices[0]
    return c.text, c.logprobs.model_dump_json() if c.logprobs else None


def test_one_request_three_ways_same_bytes(model: sk.Model, tmp_path: Path) -> None:
    head = document(model, 3501)
    prompts = [head + p for p in prompts_for(50)]
    probe = prompts[17]

    def create(c: openai.OpenAI, prompt: str) -> openai.types.Completion:
        return c.completions.create(
            model=c.models.list().data[0].id,
            prompt=prompt,
            max_tokens=32,
            temperature=0,
            logprobs=2,
        )

    with serve_process(ARGS, tmp_path) as s:
        alone = _answer(create(openai.OpenAI(base_url=s.v1, api_key="x"), probe))
    with serve_process(ARGS, tmp_path) as s:

        async def crowd() -> list[openai.types.Completion]:
            async with openai.AsyncOpenAI(base_url=s.v1, api_key="x", timeout=600) as ac:
                mid = (await ac.models.list()).data[0].id
                return await asyncio.gather(
                    *(
                        ac.completions.create(
                            model=mid, prompt=p, max_tokens=32, temperature=0, logprobs=2
                        )
                        for p in prompts
                    )
                )

        results = asyncio.run(crowd())
        among = _answer(results[17])
        again = create(openai.OpenAI(base_url=s.v1, api_key="x"), probe)
        assert again.usage is not None and again.usage.prompt_tokens_details is not None
        assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
        cached = _answer(again)
        # the head was prefilled once: the other 49 read it from the cache
        reused = [r.usage.prompt_tokens_details.cached_tokens for r in results]  # type: ignore[union-attr]
        assert sum(1 for n in reused if n >= 3500) >= 49, reused
        # and tokenized once: the others' texts were tokenized only after the shared head
        assert s.status()["tokenizer_tokens_reused"] >= 49 * 3500
        whole = [len(model.tokenize(p, add_special=True, parse_special=True)) for p in prompts]
        assert [r.usage.prompt_tokens for r in results] == whole  # type: ignore[union-attr]
    assert alone == among == cached
