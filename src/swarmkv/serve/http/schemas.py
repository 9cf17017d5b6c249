"""Request bodies, as OpenAI's API shapes them (the fields SwarmKV serves). FastAPI builds the
OpenAPI schema from these models; a body that does not fit is a 400 naming the field."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_N = 16
MAX_TOP_LOGPROBS = 20
MAX_STOP = 4
SEED_MAX = 2**32 - 1
Stop = str | Annotated[list[str], Field(max_length=MAX_STOP)] | None


class StreamOptions(BaseModel):
    include_usage: bool = False


class Sampling(BaseModel):
    """The fields both endpoints share."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=1, le=2**31 - 1)
    seed: int | None = Field(default=None, ge=0, le=SEED_MAX)
    stop: Stop = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    # SwarmKV's own: the scheduling priority under --policy priority
    priority: int = Field(default=0, ge=-(2**31), le=2**31 - 1)


class CompletionRequest(Sampling):
    prompt: str | Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None


class ChatRequest(Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
