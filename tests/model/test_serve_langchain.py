"""LangChain's ChatOpenAI against `swarmkv serve` on the default model (Gemma 3 270M, its own
chat template): `.invoke` gets an AIMessage whose content is exactly what the `openai` client's
chat.completions.create answers for the same message at temperature 0 and max_tokens 8."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
from langchain_core.messages import AIMessage
from langchain_openai import ChatOpenAI

from support.serving import serve_process

pytestmark = [pytest.mark.slow, pytest.mark.model, pytest.mark.serve]
ARGS = ["-c", "2048", "-t", "2"]
KEY = "sk-langchain-test-key"
PROMPT = "Say hi"


def test_chat_openai_invoke_matches_the_openai_client(tmp_path: Path) -> None:
    with serve_process([*ARGS, "--api-key", KEY], tmp_path) as served:
        models = httpx.get(
            served.v1 + "/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=10
        ).json()
        model_id = models["data"][0]["id"]
        llm = ChatOpenAI(
            base_url=served.v1, api_key=KEY, model=model_id, temperature=0, max_tokens=8,
            max_retries=0, timeout=120,
        )  # fmt: skip
        message = llm.invoke(PROMPT)
        client = openai.OpenAI(base_url=served.v1, api_key=KEY, max_retries=0, timeout=120)
        direct = client.chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": PROMPT}], temperature=0,
            max_tokens=8,
        )  # fmt: skip
    assert isinstance(message, AIMessage)
    assert isinstance(message.content, str) and message.content.strip(), message
    assert message.content == direct.choices[0].message.content
    # the same request, so the same metadata: the served model, the exact-kernels fingerprint
    assert message.response_metadata["model_name"] == model_id
    assert message.response_metadata["system_fingerprint"] == direct.system_fingerprint
    assert direct.system_fingerprint is not None and direct.system_fingerprint.endswith("-exact")
    assert message.usage_metadata is not None and direct.usage is not None
    assert message.usage_metadata["output_tokens"] == direct.usage.completion_tokens <= 8
