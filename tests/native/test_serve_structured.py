"""Structured output through `swarmkv serve`, with the official `openai` client on the tiny
model: OpenAI's response_format, llama-server's grammar and json_schema, vLLM's guided_*
fields; streaming and n > 1; the same answer alone and under load; a bad field a 400 naming
it before anything is queued."""

from __future__ import annotations

import json
import math
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import openai
import pytest

from support.serving import Served

DOC = "The review board met on the third of May and counted the open cases. " * 4
VERDICT = {
    "type": "object",
    "properties": {
        "verdict": {"enum": ["yes", "no", "unsure"]},
        "cases": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["verdict", "cases"],
    "additionalProperties": False,
}
LABELS = ["approved", "rejected", "needs review"]


def _complete(client: openai.OpenAI, prompt: str, **extra: Any) -> openai.types.Completion:
    return client.completions.create(
        model="",
        prompt=prompt,
        max_tokens=extra.pop("max_tokens", 40),
        temperature=extra.pop("temperature", 0),
        n=extra.pop("n", 1),
        seed=extra.pop("seed", 1),
        extra_body=extra,
    )


def test_chat_response_format_json_schema_validates(client: openai.OpenAI) -> None:
    for temperature in (0.0, 1.2):
        out = client.chat.completions.create(
            model="",
            messages=[{"role": "user", "content": DOC + "Was the board quorate?"}],
            max_tokens=40,
            temperature=temperature,
            seed=7,
            n=3,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "verdict", "schema": VERDICT, "strict": True},
            },
        )
        for choice in out.choices:
            assert choice.finish_reason == "stop", choice
            jsonschema.validate(json.loads(choice.message.content or ""), VERDICT)


def test_json_object_is_an_object_or_reported_cut(client: openai.OpenAI) -> None:
    out = _complete(client, DOC + "As JSON:", response_format={"type": "json_object"}, n=4,
                    temperature=1.0, max_tokens=48)  # fmt: skip
    finished = 0
    for choice in out.choices:
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.text), dict), choice.text
            finished += 1
        else:  # cut at max_tokens before the object closed: a length, never a bad "stop"
            assert choice.finish_reason == "length"
            with pytest.raises(json.JSONDecodeError):
                json.loads(choice.text)
    assert out.usage is not None and out.usage.completion_tokens <= 4 * 48


def test_a_cut_schema_is_a_length(client: openai.OpenAI) -> None:
    out = _complete(client, DOC, json_schema=VERDICT, max_tokens=3)
    assert out.choices[0].finish_reason == "length"
    assert out.choices[0].text.startswith('{"')  # forced, fast-forwarded


@pytest.mark.parametrize(
    ("field", "value", "check"),
    [
        ("grammar", 'root ::= "case-" [0-9] [0-9]', r"case-[0-9]{2}"),
        ("guided_regex", r"[0-9]{4}-[0-9]{2}-[0-9]{2}", r"[0-9]{4}-[0-9]{2}-[0-9]{2}"),
        ("guided_grammar", 'start: "id:" /[a-z]{3}/', r"id:[a-z]{3}"),
    ],
)
def test_grammar_regex_and_lark_fields_match(
    client: openai.OpenAI, field: str, value: str, check: str
) -> None:
    out = _complete(client, DOC + "Answer:", n=3, temperature=1.5, **{field: value})
    for choice in out.choices:
        assert re.fullmatch(check, choice.text), (field, choice.text)
        assert choice.finish_reason == "stop"


def test_guided_json_and_llama_server_json_schema_agree(client: openai.OpenAI) -> None:
    a = _complete(client, DOC + "JSON:", guided_json=VERDICT)
    b = _complete(client, DOC + "JSON:", json_schema=VERDICT)
    c = _complete(client, DOC + "JSON:", guided_json=json.dumps(VERDICT))
    assert a.choices[0].text == b.choices[0].text == c.choices[0].text
    jsonschema.validate(json.loads(a.choices[0].text), VERDICT)


def test_logprobs_are_those_of_the_constrained_distribution(client: openai.OpenAI) -> None:
    """Tokens a constraint forbids have probability zero: never listed (JSON has no -inf;
    the fuzz found a 500 here), so a narrow regex lists fewer than asked; the drawn token's
    probabilities sum to at most one; a token the grammar forced has logprob 0.0."""
    out = _complete(client, DOC, guided_regex="\u00b8\u00fe", logprobs=14, stop="\u00f3")
    lp = out.choices[0].logprobs
    assert out.choices[0].text == "\u00b8\u00fe" and lp is not None
    assert lp.token_logprobs is not None and lp.top_logprobs is not None
    assert all(x is not None and x <= 0.0 for x in lp.token_logprobs), lp
    assert sum(len(top) for top in lp.top_logprobs) < 14 * len(lp.top_logprobs), lp
    for top in lp.top_logprobs:
        assert sum(math.exp(x) for x in top.values()) <= 1.0 + 1e-9, top
    chat = client.chat.completions.create(
        model="",
        messages=[{"role": "user", "content": DOC + "Verdict?"}],
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=20,
        extra_body={"guided_choice": ["needs review"]},
    )
    assert chat.choices[0].message.content == "needs review"
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content and all(t.logprob == 0.0 for t in content), content  # one answer: forced
    assert all([e.token for e in t.top_logprobs] == [t.token] for t in content)


def test_streamed_choices_match_the_whole_answer(client: openai.OpenAI) -> None:
    whole = _complete(client, DOC + "Verdict:", guided_choice=LABELS, n=3, temperature=1.5)
    stream = client.completions.create(
        model="",
        prompt=DOC + "Verdict:",
        max_tokens=40,
        temperature=1.5,
        n=3,
        seed=1,
        stream=True,
        extra_body={"guided_choice": LABELS},
    )
    texts, finish = ["", "", ""], [None, None, None]
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.text
            finish[c.index] = c.finish_reason or finish[c.index]
    assert texts == [c.text for c in sorted(whole.choices, key=lambda c: c.index)]
    assert all(t in LABELS for t in texts) and finish == ["stop"] * 3


def test_a_constrained_answer_is_the_same_under_load(client: openai.OpenAI) -> None:
    alone = _complete(client, DOC + "Load:", json_schema=VERDICT, temperature=0.9, seed=3)
    with ThreadPoolExecutor(6) as pool:
        others = [
            pool.submit(_complete, client, DOC + f"Other {i}:", guided_choice=LABELS, seed=i)
            for i in range(5)
        ]
        again = pool.submit(
            _complete, client, DOC + "Load:", json_schema=VERDICT, temperature=0.9, seed=3
        )
        for f in others:
            f.result()
    assert again.result().choices[0].text == alone.choices[0].text


def _refused(client: openai.OpenAI, param: str, match: str, **extra: Any) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        _complete(client, DOC, **extra)
    body = err.value.body
    assert isinstance(body, dict) and body["param"] == param, body
    assert re.search(match, body["message"]), body["message"]


@pytest.mark.parametrize(
    ("param", "match", "extra"),
    [
        ("grammar", "give one structured-output field, not json_schema and grammar",
         {"json_schema": VERDICT, "grammar": 'root ::= "a"'}),
        ("guided_regex", "not response_format and guided_regex",
         {"response_format": {"type": "json_object"}, "guided_regex": "a+"}),
        ("response_format", "needs json_schema.schema",
         {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
        ("json_schema", "json_schema: json_schema: ", {"json_schema": {"type": "nonsense"}}),
        ("guided_json", "not JSON", {"guided_json": "{not json"}),
        ("guided_choice", "the list of strings is empty", {"guided_choice": []}),
        ("guided_regex", "guided_regex: regex: ", {"guided_regex": "(unclosed"}),
        ("grammar", "llama.cpp cannot parse the grammar", {"grammar": "root ::= [0-9"}),
        ("guided_grammar", "guided_grammar: grammar: ", {"guided_grammar": "start: ("}),
    ],
)  # fmt: skip
def test_a_bad_structured_field_is_a_400_naming_it(
    client: openai.OpenAI, served: Served, param: str, match: str, extra: dict[str, Any]
) -> None:
    before = served.app.state.runtime.status()["finished"]
    _refused(client, param, match, **extra)
    runtime = served.app.state.runtime
    assert runtime.status()["finished"] == before and runtime.status()["queued"] == 0
    assert runtime.audit() == []
