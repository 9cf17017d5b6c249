"""Request bodies, as OpenAI's API shapes them (the fields SwarmKV serves). FastAPI builds the
OpenAPI schema from these models; a body that does not fit is a 400 naming the field.

Strict, with JSON Schema's types: a value of the wrong JSON type ("8" or true for an integer,
"true" or 1 for a boolean) is refused, as the schema says, instead of coerced. An integer is
a valid number, and a number with no fraction (8.0) a valid integer, as JSON Schema has it.
Unknown fields are ignored, as OpenAI's SDKs send fields a server may not know."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

MAX_N = 16
MAX_TOP_LOGPROBS = 20
MAX_STOP = 4
SEED_MAX = 2**32 - 1


def _integral(value: object) -> object:
    """8.0 -> 8 (JSON Schema's integer); anything else as it is, for the strict check."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# Each bound before the validator, or pydantic writes `ge` instead of `minimum` in the schema.
_INTEGRAL = BeforeValidator(_integral)
PositiveInt = Annotated[int, Field(ge=1), _INTEGRAL]
TokenId = Annotated[int, Field(ge=0), _INTEGRAL]
Seed = Annotated[int, Field(ge=0, le=SEED_MAX), _INTEGRAL]
TopK = Annotated[int, Field(ge=1, le=2**31 - 1), _INTEGRAL]
N = Annotated[int, Field(ge=1, le=MAX_N), _INTEGRAL]
Priority = Annotated[int, Field(ge=-(2**31), le=2**31 - 1), _INTEGRAL]
TopLogprobs = Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS), _INTEGRAL]
Stop = str | Annotated[list[str], Field(max_length=MAX_STOP)] | None


class Body(BaseModel):
    """What every request object shares: strict types, unknown fields ignored."""

    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(Body):
    include_usage: bool = False


class JsonSchemaFormat(Body):
    """OpenAI's `response_format.json_schema`: the schema is always enforced (`strict` or not)."""

    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None
    # llama-server's extension: {"type": "json_object", "schema": {...}}
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")


class Structured(Body):
    """Structured output, as OpenAI, llama-server and vLLM ask for it: at most one of these
    (serve.http.structured)."""

    response_format: ResponseFormat | None = None
    json_schema: dict[str, Any] | bool | None = None  # llama-server
    grammar: str | None = None  # llama-server: GBNF
    guided_json: dict[str, Any] | str | None = None  # vLLM
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None  # llguidance's Lark-like syntax


class Sampling(Structured):
    """The fields both endpoints share."""

    model: str | None = None
    max_tokens: PositiveInt | None = None
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: TopK | None = None
    seed: Seed | None = None
    stop: Stop = None
    n: N = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    # SwarmKV's own: the scheduling priority under --policy priority
    priority: Priority = 0


class CompletionRequest(Sampling):
    prompt: str | Annotated[list[TokenId], Field(min_length=1)]
    logprobs: TopLogprobs | None = None
    echo: bool = False


class TextPart(Body):
    type: Literal["text"]
    text: str


class Message(Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None


class ChatRequest(Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool = False
    top_logprobs: TopLogprobs | None = None


class WarmRequest(Body):
    """POST /v1/warm (SwarmKV's own): a prompt to prefill on every engine (serve.http.warm)."""

    model: str | None = None
    prompt: str | Annotated[list[TokenId], Field(min_length=1)]
