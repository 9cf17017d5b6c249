"""`swarmkv serve` fuzzed from its own OpenAPI schema: schemathesis generates well-formed and
malformed requests for every operation FastAPI documents (over a thousand in all) and sends
them to the real CLI serving the tiny model. Proven: no answer is a 5xx; every error is
OpenAI's `{"error": {"message", "type", "param", "code"}}` with a documented status; every
malformed body is rejected; every 200 from a
completion endpoint is a whole answer (n choices, a stream that ends in `data: [DONE]` with
no error event), and every 200 from /v1/warm fits its documented schema; a well-formed body
is refused only for a reason the server documents; and
afterwards the server is healthy and still answers.

The schema is the one the server serves (src/swarmkv/serve/http/openapi.py): every status and
media type the server sends is documented there (400 in OpenAI's error shape, not FastAPI's
422; text/event-stream for a stream; text/plain for /metrics), so a status or media type
outside it fails status_code_conformance or content_type_conformance. The request models are
strict, so every malformed body, a wrongly typed value included, must be refused.

Every request is written to requests.txt in the test's tmp_path before it is sent (as curl),
so a server that stops answering can be replayed; after the first unanswered request the fuzz
sends nothing more and fails.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import hypothesis
import openai
import pytest
import requests
import schemathesis
from hypothesis import strategies as st
from schemathesis import Case, CheckContext, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from swarmkv.serve.http.schemas import Structured

from support.serving import Served, serve_process

pytestmark = [pytest.mark.slow, pytest.mark.serve]

MAX_TOKENS = 8  # generated max_tokens above this are lowered to it (see `bounded`)
MAX_N = 4  # likewise n: the fuzz is about the HTTP layer, not decode throughput
COMPLETIONS = ("POST", "/v1/completions")
CHAT = ("POST", "/v1/chat/completions")
WARM = ("POST", "/v1/warm")
# Hypothesis examples per operation and generation mode. The GET routes take no parameters,
# so Hypothesis runs each of them once whatever max_examples says.
EXAMPLES: dict[tuple[str, str], dict[GenerationMode, int]] = {
    COMPLETIONS: {GenerationMode.POSITIVE: 300, GenerationMode.NEGATIVE: 220},
    CHAT: {GenerationMode.POSITIVE: 300, GenerationMode.NEGATIVE: 220},
    WARM: {GenerationMode.POSITIVE: 60, GenerationMode.NEGATIVE: 60},
}
GET_EXAMPLES = 5
MIN_REQUESTS = 1000

# The reasons a body the schema accepts may still get 400 (docs/guide/serve.md's error table):
# these depend on the model or on two fields together, which JSON Schema as FastAPI writes it
# cannot say, so positive_data_acceptance is replaced by this narrower check.
# invalid_constraint: a structured-output field (a JSON schema, a regex, a grammar) that does
# not compile: the OpenAPI schema can say only that it is an object or a string
POSITIVE_400_CODES = {"model_not_found", "context_length_exceeded", "invalid_constraint"}
STRUCTURED_FIELDS = tuple(Structured.model_fields)
POSITIVE_400_MESSAGES = (
    "unknown model",  # model: only the served id (or none) is accepted
    "echo with logprobs",  # echo + logprobs (prompt logprobs) is not supported
    "top_logprobs needs logprobs",  # chat: top_logprobs without logprobs: true
    "outside the vocabulary",  # a token id >= n_vocab
    "NUL character",  # a NUL in a prompt or a message: llama.cpp takes C strings
)


@dataclass
class Ledger:
    """What the fuzz sent and what came back, for the final assertions."""

    sent: int = 0
    by_status: dict[int, int] = field(default_factory=dict)
    positive_ok: dict[str, int] = field(default_factory=dict)
    positive_sent: dict[str, int] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)  # one example per kind of failure
    slowest: tuple[float, str] = (0.0, "")
    refusals: dict[str, int] = field(default_factory=dict)

    def fail(self, kind: str, detail: str) -> None:
        self.failures.setdefault(kind, detail)


def openai_error_shape(ctx: CheckContext, response: Any, case: Case) -> None:
    """Every 4xx/5xx body is exactly OpenAI's error object."""
    if response.status_code < 400:
        return
    body = response.json()
    assert isinstance(body, dict) and set(body) == {"error"}, f"not an error object: {body!r}"
    err = body["error"]
    assert isinstance(err, dict), f"error is not an object: {body!r}"
    assert set(err) == {"message", "type", "param", "code"}, f"error keys: {sorted(err)}"
    assert isinstance(err["message"], str) and err["message"], body
    assert isinstance(err["type"], str) and err["type"], body
    assert err["param"] is None or isinstance(err["param"], str), body
    assert err["code"] is None or isinstance(err["code"], str), body


def whole_answer(ctx: CheckContext, response: Any, case: Case) -> None:
    """A 200 from a completion endpoint holds all n choices, each finished; a stream ends in
    `data: [DONE]` and carries no error event."""
    if response.status_code != 200 or not isinstance(case.body, dict):
        return
    if (case.method.upper(), case.path) not in (COMPLETIONS, CHAT):
        return  # /v1/warm's answer: its schema (response_schema_conformance)
    n = case.body.get("n", 1)  # an integer, as JSON Schema has it (2 or 2.0)
    assert not isinstance(n, bool) and float(n).is_integer(), f"answered n={n!r}: {case.body}"
    n = int(n)
    ctype = response.headers.get("content-type", [""])[0]
    if "text/event-stream" in ctype:
        lines = response.content.decode().split("\n\n")
        data = [x.removeprefix("data: ") for x in lines if x.startswith("data: ")]
        assert data and data[-1] == "[DONE]", f"the stream did not end in [DONE]: {data[-3:]}"
        finished = set()
        for raw in data[:-1]:
            event = json.loads(raw)
            assert "error" not in event, f"an error event in a 200 stream: {event}"
            for choice in event["choices"]:
                if choice["finish_reason"] is not None:
                    finished.add(choice["index"])
        assert finished == set(range(n)), f"choices finished: {sorted(finished)} of n={n}"
        return
    body = response.json()
    assert "error" not in body, body
    assert [c["index"] for c in body["choices"]] == list(range(n)), body
    assert all(c["finish_reason"] in ("stop", "length") for c in body["choices"]), body
    assert body["usage"]["completion_tokens"] <= n * MAX_TOKENS * 2, body["usage"]


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
    negative_data_rejection,
    openai_error_shape,
    whole_answer,
]
# Left out, each for a stated reason:
#  * positive_data_acceptance: a body the schema accepts is refused with 400 for reasons no
#    JSON Schema FastAPI writes can state (another model's id, a prompt longer than n_ctx in
#    tokens, a token id past the vocabulary, a NUL in a C string, echo with logprobs,
#    top_logprobs without logprobs); `Fuzz.positive_refusal` checks that every such 400
#    gives one of those reasons, and the final test that most well-formed bodies are answered.
#  * max_response_time: no response-time limit is configured (decode speed is not the point).
#  * use_after_free, ensure_resource_availability: stateful checks for created resources;
#    this API creates none.
#  * ignored_auth: this run has no --api-key, so the schema declares no security scheme.
#  * missing_required_header, unsupported_method: coverage-phase scenarios (headers the schema
#    requires, methods it does not list) that this fuzz does not generate.


def as_int(value: Any) -> int | None:
    """A JSON number or numeric string as an int (8, 8.0, "8"), else None."""
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return int(number) if number.is_integer() else None


def bounded(body: Any, chat: bool) -> Any:
    """Lower max_tokens/max_completion_tokens/n values above the caps (keeping each value's
    JSON type: 99 -> 8, 99.0 -> 8.0, "99" -> "8"), and give a chat request without a limit
    one (else it decodes to n_ctx). A value below the minimum or not a number is left alone,
    so a malformed body stays malformed."""
    if not isinstance(body, dict):
        return body
    for key, cap in (
        ("max_tokens", MAX_TOKENS),
        ("max_completion_tokens", MAX_TOKENS),
        ("n", MAX_N),
    ):
        value = body.get(key)
        number = None if isinstance(value, bool) else as_int(value)
        if number is not None and number > cap:
            body[key] = type(value)(cap)
    if chat and body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = MAX_TOKENS
    return body


def _nonneg_int(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and value >= 0
        and float(value).is_integer()
    )


class Fuzz:
    """Sends one generated case, validates it with CHECKS, records the outcome."""

    def __init__(
        self, served: Served, model_id: str, n_vocab: int, ledger: Ledger, journal: Path
    ) -> None:
        self.served, self.model_id, self.ledger = served, model_id, ledger
        self.n_vocab = n_vocab
        self.session = requests.Session()
        self.journal = journal.open("a", encoding="utf-8")  # each request, before it is sent
        self.stuck = False  # a request went unanswered: the rest are not sent

    def send(self, case: Case, draw: int) -> None:
        label = f"{case.method} {case.path}"
        body = case.body if isinstance(case.body, dict) else None
        if body is not None:
            # Most well-formed bodies name the served model (or none), so that they reach the
            # engine; the rest keep their generated name, which must give model_not_found.
            if draw and isinstance(body.get("model"), str):
                body["model"] = self.model_id
            # Most carry no structured-output field: a generated grammar or schema rarely
            # compiles, and the answered share checked below needs requests that can be
            # answered. One body in eight keeps its own (and every negative one).
            # They also give token ids inside the vocabulary (a drawn id mostly is not).
            if draw >= 2:
                for key in STRUCTURED_FIELDS:
                    body.pop(key, None)
                prompt = body.get("prompt")
                if isinstance(prompt, list) and all(_nonneg_int(t) for t in prompt):
                    body["prompt"] = [int(t) % self.n_vocab for t in prompt]
            bounded(body, chat=case.path == CHAT[1])
        if self.stuck:
            return
        positive = case.meta is not None and case.meta.generation.mode.is_positive
        curl = case.as_curl_command(base_url=self.served.base)
        print(curl, file=self.journal, flush=True)
        self.ledger.sent += 1
        try:
            response = case.call(base_url=self.served.base, session=self.session, timeout=120)
        except requests.RequestException as exc:
            self.ledger.fail(f"{label} no answer: {type(exc).__name__}", f"{exc}\n{curl}")
            self.stuck = True
            return
        self.ledger.slowest = max(self.ledger.slowest, (response.elapsed, curl))
        status = response.status_code
        self.ledger.by_status[status] = self.ledger.by_status.get(status, 0) + 1
        if positive:
            self.ledger.positive_sent[label] = self.ledger.positive_sent.get(label, 0) + 1
            if status == 200:
                self.ledger.positive_ok[label] = self.ledger.positive_ok.get(label, 0) + 1
        try:
            case.validate_response(response, checks=CHECKS)
            if positive and status == 400:
                err = response.json()["error"]
                known = [m for m in POSITIVE_400_MESSAGES if m in err["message"]]
                reason = f"{label}: {err['code'] or (known or [err['message'][:40]])[0]}"
                self.ledger.refusals[reason] = self.ledger.refusals.get(reason, 0) + 1
                self.positive_refusal(err)
        except FailureGroup as exc:
            self.fail(label, status, exc, curl)
        except Exception as exc:  # an assertion of this file's checks, or a body they choke on
            self.fail(label, status, exc, curl)

    def fail(self, label: str, status: int, exc: Exception, curl: str) -> None:
        first = (str(exc).splitlines() or [""])[0][:120]
        self.ledger.fail(f"{label} {status} {type(exc).__name__}: {first}", f"{exc}\n{curl}")

    @staticmethod
    def positive_refusal(err: dict[str, Any]) -> None:
        if err["code"] in POSITIVE_400_CODES:
            return
        assert any(m in err["message"] for m in POSITIVE_400_MESSAGES), (
            f"a well-formed body refused for an undocumented reason: {err}"
        )


@pytest.fixture(scope="module")
def served(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    args = [
        "-m",
        str(tiny_model_path),
        "--chat-template",
        "chatml",
        "-c",
        "2048",
        "-t",
        "2",
        "--max-live",
        "4",
    ]
    with serve_process(args, tmp_path_factory.mktemp("serve-fuzz")) as s:
        yield s


@pytest.fixture(scope="module")
def raw_schema(served: Served) -> dict[str, Any]:
    out: dict[str, Any] = httpx.get(served.base + "/openapi.json", timeout=10).json()
    return out


@pytest.fixture(scope="module")
def model_id(served: Served) -> str:
    return str(httpx.get(served.v1 + "/models", timeout=10).json()["data"][0]["id"])


@pytest.fixture(scope="module")
def ledger() -> Ledger:
    return Ledger()


def test_every_documented_operation_survives_generated_requests(
    served: Served,
    raw_schema: dict[str, Any],
    model_id: str,
    tiny_model: Any,
    ledger: Ledger,
    tmp_path: Path,
) -> None:
    schema = schemathesis.openapi.from_dict(raw_schema)
    schema.config.update(base_url=served.base, request_timeout=120)
    # Read a stream to its end (the default stops after 20 events), so whole_answer sees it all.
    schema.config.max_stream_events = 10_000
    schema.config.output.sanitization.enabled = False  # it hides max_tokens ("token")
    fuzz = Fuzz(served, model_id, tiny_model.n_vocab, ledger, tmp_path / "requests.txt")
    operations = [r.ok() for r in schema.get_all_operations()]
    labels = {(op.method.upper(), op.path) for op in operations}
    assert {COMPLETIONS, CHAT, WARM, ("GET", "/v1/models"), ("GET", "/health")} <= labels, labels
    for op in operations:
        modes = EXAMPLES.get((op.method.upper(), op.path), {GenerationMode.POSITIVE: GET_EXAMPLES})
        for mode, count in modes.items():

            @hypothesis.settings(
                max_examples=count,
                deadline=None,
                database=None,
                # the same requests every run: the answered share checked below depends on
                # them (one random run drew 105 token ids outside the vocabulary of 302)
                derandomize=True,
                phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
                suppress_health_check=list(hypothesis.HealthCheck),
            )
            @hypothesis.given(case=op.as_strategy(generation_mode=mode), draw=st.integers(0, 7))
            def run(case: Case, draw: int) -> None:
                fuzz.send(case, draw)

            run()
    problems = "\n\n".join(f"[{k}]\n{v}" for k, v in ledger.failures.items())
    assert not ledger.failures, f"{len(ledger.failures)} kinds of failure:\n{problems}"


def test_the_fuzz_sent_enough_and_reached_the_engine(ledger: Ledger) -> None:
    """The fuzz above really ran: >= 1000 requests, and most well-formed completion requests
    were answered (200), so generation itself was exercised, not only the validators."""
    print(f"sent {ledger.sent}: {ledger.by_status}; slowest {ledger.slowest[0]:.1f} s")
    print(ledger.positive_sent, ledger.positive_ok)
    for reason, count in sorted(ledger.refusals.items(), key=lambda kv: -kv[1]):
        print(f"{count:5d} well-formed but refused: {reason}")
    assert ledger.sent >= MIN_REQUESTS, f"only {ledger.sent} requests sent: {ledger.by_status}"
    assert not any(s >= 500 for s in ledger.by_status), ledger.by_status
    for op in (COMPLETIONS, CHAT, WARM):
        label = " ".join(op)
        sent, ok = ledger.positive_sent.get(label, 0), ledger.positive_ok.get(label, 0)
        assert ok >= sent // 2, f"{label}: only {ok} of {sent} well-formed requests answered"


def test_the_server_is_healthy_and_answers_after_the_fuzz(served: Served, model_id: str) -> None:
    health = httpx.get(served.base + "/health", timeout=10)
    assert health.status_code == 200, health.text
    client = openai.OpenAI(base_url=served.v1, api_key="unused", max_retries=0, timeout=60)
    out = client.completions.create(
        model=model_id, prompt="Once upon a time", max_tokens=6, temperature=0
    )
    assert out.choices[0].finish_reason == "length"
    assert out.usage is not None and out.usage.completion_tokens == 6
    chat = client.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        temperature=0,
    )
    assert chat.choices[0].message.content is not None
    status = served.status()
    assert status["live"] == 0 and status["queued"] == 0, status


def test_the_served_schema_describes_what_the_server_sends(raw_schema: dict[str, Any]) -> None:
    """The schema as served documents the 400 errors (not FastAPI's 422), the event stream and
    the Prometheus text, so the fuzz above checks against what the server really sends."""
    for path in ("/v1/completions", "/v1/chat/completions"):
        responses = raw_schema["paths"][path]["post"]["responses"]
        assert {"400", "413", "429", "503"} <= set(responses), sorted(responses)
        assert "422" not in responses, sorted(responses)
        assert "text/event-stream" in responses["200"]["content"], responses["200"]
    content = raw_schema["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(content) == ["text/plain"], content
    assert "HTTPValidationError" not in raw_schema["components"]["schemas"]


@pytest.mark.parametrize(
    "wrong",
    [{"max_tokens": "2"}, {"max_tokens": True}, {"echo": "true"}, {"prompt": ["1"]}, {"n": 1.5}],
    ids=str,
)
def test_a_wrong_json_type_is_rejected(served: Served, wrong: dict[str, Any]) -> None:
    """A value of the wrong JSON type is a 400 naming the field, as the schema (and OpenAI)
    say, not coerced."""
    body = {"prompt": "Hello", "max_tokens": 2, **wrong}
    r = httpx.post(served.v1 + "/completions", json=body, timeout=60)
    assert r.status_code == 400, f"{body} -> {r.status_code} {r.text[:200]}"
    assert r.json()["error"]["param"].split(".")[0] == next(iter(wrong)), r.text


def test_a_number_with_no_fraction_is_an_integer(served: Served) -> None:
    """JSON Schema's integer includes 2.0, so the schema's positive cases may send it."""
    body = {"prompt": [1.0, 2], "max_tokens": 2.0, "n": 2.0, "temperature": 0}
    r = httpx.post(served.v1 + "/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 2 and r.json()["usage"]["prompt_tokens"] == 2, r.text
