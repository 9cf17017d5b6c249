"""llama-server's RAM prompt cache with --swa-full (patch 0012): a prompt past Gemma 3's
512-token window, pushed out of its slot by another prompt and then sent again, is restored
from the cache and rewound to its last prompt token. It must answer what a fresh decode of
it answers. Before patch 0012 the saved state lacked the cells the window masked when it was
saved, so the rewound token saw fewer cells and some answers changed (found by `swarmkv bench
--serve`: the peers' "as alone" column on cold prompts). The kernels are batch-invariant, so
the probabilities must match as well as the text. Skipped when llama-server is not built
(optional, never part of `pip install`; CI builds it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

import swarmkv as sk
from swarmkv_bench.peer_server import LlamaServer, ServerConfig, find_llama_server, size_n_ctx
from swarmkv_bench.serve_workloads import Shapes, build

SERVER = find_llama_server(Path(__file__).resolve().parents[2])
N_PREDICT = 16
# Cold prompts of about 520 tokens: past the 512-token window. Agents 8-10 are three whose
# answers changed after a restore without patch 0012 (checked); every one must hold.
AGENTS = slice(8, 11)

pytestmark = [
    pytest.mark.slow,  # the slow tier: the llama-server peers
    pytest.mark.peer,
    pytest.mark.skipif(
        SERVER is None, reason="llama-server not built (bash bench/build_llama_server.sh)"
    ),
]


def _ask(client: httpx.Client, prompt: str, *, cache_prompt: bool) -> dict[str, Any]:
    body = {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0, "n_probs": 4}
    reply = client.post("/completion", json={**body, "cache_prompt": cache_prompt}, timeout=120)
    reply.raise_for_status()
    return dict(reply.json())


def test_a_prompt_restored_from_the_ram_cache_answers_as_fresh(model: sk.Model) -> None:
    work = build("cold", model, Shapes(agents=11, cold_tokens=500, n_predict=N_PREDICT))
    prompts = [a.head + a.questions[0] for a in work.agents[AGENTS]]
    longest = max(len(model.tokenize(p)) for p in prompts)
    assert longest > model.n_swa > 0  # past the window, or the test proves nothing
    config = ServerConfig(
        sk.default_model_path(),
        size_n_ctx(longest, N_PREDICT),
        threads=2,
        swa_full=True,
        flash_attn="on",
        batch_invariant=True,
    )
    assert SERVER is not None
    with LlamaServer(SERVER, config) as server, httpx.Client(base_url=server.base_url) as client:
        # cache_prompt off: each decoded whole; the slot still saves each into the RAM cache
        # when the next one takes its place
        fresh = [_ask(client, p, cache_prompt=False) for p in prompts]
        again = [_ask(client, p, cache_prompt=True) for p in prompts]
    for i, (a, b) in enumerate(zip(fresh, again, strict=True)):
        assert a["timings"]["prompt_n"] == a["tokens_evaluated"], i  # decoded whole
        assert b["timings"]["prompt_n"] == 1, (i, b["timings"])  # restored, last token again
        assert b["content"] == a["content"], i
        assert b["completion_probabilities"] == a["completion_probabilities"], i
