"""Model on the tiny llama: shape, identity, tokenizer, build info."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

import swarmkv

REPO_ROOT = Path(__file__).resolve().parents[2]
TEXT = "Hello world, this is SwarmKV."


def test_shape_properties_match_the_generated_file(tiny_model: swarmkv.Model) -> None:
    m = tiny_model
    assert (m.n_layer, m.n_embd, m.n_head, m.n_head_kv) == (2, 64, 4, 2)
    assert m.n_vocab == 32000
    assert m.n_ctx_train == 4096
    assert m.n_swa == 0
    assert m.architecture == "llama"
    assert m.meta("general.name") == "swarmkv-tiny-llama-seed0"
    assert m.meta("no.such.key") is None
    assert m.head_dims() == (16, 16)
    # token_embd + output (32000 x 64 each) + 2 layers of attention and FFN + norms
    per_layer = 2 * 64 * 64 + 2 * 32 * 64 + 3 * 128 * 64 + 2 * 64
    assert m.n_params == 2 * 32000 * 64 + 64 + 2 * per_layer
    assert m.size_bytes == 4 * m.n_params


def test_fingerprint_is_stable_across_loads_and_differs_between_weights(
    tiny_model: swarmkv.Model, tiny_model_path: Path, other_tiny_model: swarmkv.Model
) -> None:
    with swarmkv.Model(tiny_model_path) as again:
        assert again.fingerprint == tiny_model.fingerprint
    assert len(tiny_model.fingerprint) == 64
    assert other_tiny_model.fingerprint != tiny_model.fingerprint


def test_tokenize_detokenize_round_trip(tiny_model: swarmkv.Model) -> None:
    m = tiny_model
    plain = m.tokenize(TEXT, add_special=False)
    assert plain and m.bos not in plain
    assert m.detokenize(plain) == TEXT
    with_bos = m.tokenize(TEXT)
    assert m.add_bos
    assert with_bos == [m.bos, *plain]
    assert m.detokenize(with_bos[1:]) == TEXT


def test_token_to_piece_concatenates_to_the_text(tiny_model: swarmkv.Model) -> None:
    m = tiny_model
    tokens = m.tokenize(TEXT, add_special=False)
    pieces = b"".join(m.token_to_piece(t) for t in tokens)
    # SentencePiece marks a word start with a space, the first word's too.
    assert pieces.decode() == " " + TEXT
    assert m.token_to_piece(tokens[0]) == b" Hello"


def test_bos_eos_and_end_of_generation(tiny_model: swarmkv.Model) -> None:
    m = tiny_model
    assert (m.bos, m.eos) == (1, 2)
    assert m.token_to_piece(m.bos, special=True) == b"<s>"
    assert m.token_to_piece(m.eos, special=True) == b"</s>"
    assert m.token_to_piece(m.bos) == b""  # special tokens render empty unless asked
    assert m.is_eog(m.eos)
    assert not m.is_eog(m.bos)


@pytest.mark.parametrize("token", [-1, 32000, 2**31 - 1])
def test_bad_token_id_raises_config_error(tiny_model: swarmkv.Model, token: int) -> None:
    with pytest.raises(swarmkv.ConfigError, match="outside the vocabulary"):
        tiny_model.token_to_piece(token)
    with pytest.raises(swarmkv.ConfigError):
        tiny_model.detokenize([tiny_model.bos or 0, token])
    with pytest.raises(swarmkv.ConfigError):
        tiny_model.is_eog(token)


def test_llama_cpp_commit_matches_the_lock_file() -> None:
    lock = tomllib.loads((REPO_ROOT / "vendor/llama.cpp.lock").read_text())
    assert lock["commit"] == swarmkv.LLAMA_CPP_COMMIT
    assert len(swarmkv.LLAMA_CPP_COMMIT) == 40


def test_tiny_model_generator_is_deterministic(tiny_model_path: Path, tmp_path: Path) -> None:
    from support.tinymodel import make_tiny_model

    again = make_tiny_model(tmp_path / "again.gguf", seed=0)
    assert again.read_bytes() == tiny_model_path.read_bytes()
