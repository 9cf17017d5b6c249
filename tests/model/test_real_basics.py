"""The default model loads, tokenizes, decodes and generates deterministically."""

from __future__ import annotations

import swarmkv as sk

from support.decoding import continue_greedy


def test_default_model_shape(model: sk.Model) -> None:
    assert model.architecture == "gemma3"
    assert model.n_swa == 512
    assert model.n_vocab > 200_000
    assert model.n_ctx_train >= 8192


def test_tokenize_detokenize_round_trip(model: sk.Model) -> None:
    text = "SwarmKV prefills a shared document once, then fans it out. Ünïcode ✓ 123."
    tokens = model.tokenize(text, add_special=False)
    assert len(tokens) > 5
    assert model.detokenize(tokens) == text
    with_bos = model.tokenize(text)
    assert with_bos[0] == model.bos and with_bos[1:] == tokens


def test_greedy_generation_is_deterministic(model: sk.Model) -> None:
    prompt = model.tokenize("The capital of France is")
    runs = []
    for _ in range(2):
        with sk.Context(model, n_ctx=256) as ctx:
            tokens, _ = continue_greedy(ctx, 0, prompt, 0, n=32)
        runs.append(tokens)
    assert len(runs[0]) == 32
    assert runs[0] == runs[1]
    assert model.detokenize(runs[0]).strip()
