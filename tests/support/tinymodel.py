"""Tiny random-weight llama-architecture GGUF models for native tests (no download, no GPU).

The tokenizer comes from a vocab-only GGUF of the pinned llama.cpp tree, so tokenize and
detokenize behave like the real SentencePiece llama vocabulary; the weights are seeded random
normals, so two seeds give two models of the same shape that produce different logits.

Tensor names and shapes follow `llama_model_llama::load_arch_tensors` (src/models/llama.cpp of
the pinned tree). GGUF lists dimensions innermost first and gguf-py writes a numpy array's
shape reversed, so the loader's `{n_embd, n_vocab}` is a numpy array of shape
`(n_vocab, n_embd)`.
"""

from __future__ import annotations

import os
import struct
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]
VOCAB_DIR = REPO_ROOT / "vendor/llama.cpp/models"
DEFAULT_VOCAB = VOCAB_DIR / "ggml-vocab-llama-spm.gguf"

ARCH = "llama"
WEIGHT_STD = 0.02


def _read_kv(path: Path) -> dict[str, tuple[Any, Any, Any]]:
    """Every metadata key of a GGUF file: key -> (value, type, array sub-type).

    gguf.GGUFReader takes over a second on a 32000-token vocabulary (it makes numpy views of
    every string); this reads the key-value section only, with plain struct and numpy.
    """
    from gguf import GGUFValueType as T

    scalars = {
        T.UINT8: "<B", T.INT8: "<b", T.UINT16: "<H", T.INT16: "<h", T.UINT32: "<I",
        T.INT32: "<i", T.FLOAT32: "<f", T.BOOL: "<?", T.UINT64: "<Q", T.INT64: "<q",
        T.FLOAT64: "<d",
    }  # fmt: skip
    data = memoryview(path.read_bytes())
    off = 0

    def take(fmt: str) -> Any:
        nonlocal off
        (value,) = struct.unpack_from(fmt, data, off)
        off += struct.calcsize(fmt)
        return value

    def string() -> str:
        nonlocal off
        n = take("<Q")
        off += n
        return str(data[off - n : off], "utf-8")

    def value(vtype: T) -> Any:
        if vtype == T.STRING:
            return string()
        if vtype in scalars:
            return take(scalars[vtype])
        raise ValueError(f"{path}: unexpected GGUF value type {vtype!r}")

    if bytes(data[:4]) != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file")
    off = 4
    version, _n_tensors, n_kv = take("<I"), take("<Q"), take("<Q")
    if version < 2:
        raise ValueError(f"{path}: GGUF version {version} is not supported")
    fields: dict[str, tuple[Any, Any, Any]] = {}
    for _ in range(n_kv):
        key = string()
        vtype = T(take("<I"))
        if vtype != T.ARRAY:
            fields[key] = (value(vtype), vtype, None)
            continue
        sub_type, n = T(take("<I")), take("<Q")
        if sub_type in scalars:
            dtype = np.dtype(scalars[sub_type])
            items = np.frombuffer(data, dtype, count=n, offset=off).tolist()
            off += n * dtype.itemsize
        else:
            items = [value(sub_type) for _ in range(n)]
        fields[key] = (items, vtype, sub_type)
    return fields


@lru_cache(maxsize=4)
def _tokenizer_fields(vocab_path: str) -> tuple[tuple[str, Any, Any, Any], ...]:
    """(key, value, type, array sub-type) of every tokenizer.* key of a vocab-only GGUF."""
    fields = tuple(
        (key, value, vtype, sub_type)
        for key, (value, vtype, sub_type) in _read_kv(Path(vocab_path)).items()
        if key.startswith("tokenizer.")
    )
    if not any(key == "tokenizer.ggml.tokens" for key, *_ in fields):
        raise ValueError(f"{vocab_path} has no tokenizer.ggml.tokens")
    return fields


def make_tiny_model(
    path: str | os.PathLike[str],
    *,
    seed: int = 0,
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    n_ctx_train: int = 4096,
    vocab_path: str | os.PathLike[str] | None = None,
) -> Path:
    """Write a tiny llama GGUF with F32 N(0, 0.02) weights (seeded) to `path`; return it."""
    from gguf import GGUFWriter

    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError(f"n_embd={n_embd}, n_head={n_head}, n_head_kv={n_head_kv} do not divide")
    path = Path(path)
    vocab = Path(vocab_path) if vocab_path is not None else DEFAULT_VOCAB
    tok_fields = _tokenizer_fields(str(vocab.resolve()))
    n_vocab = next(len(value) for key, value, *_ in tok_fields if key == "tokenizer.ggml.tokens")
    head_dim = n_embd // n_head
    n_embd_kv = head_dim * n_head_kv

    writer = GGUFWriter(path, ARCH)
    writer.add_name(f"swarmkv-tiny-llama-seed{seed}")
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(0)  # ALL_F32
    for key, value, vtype, sub_type in tok_fields:
        writer.add_key_value(key, value, vtype, sub_type)

    rng = np.random.default_rng(seed)

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * WEIGHT_STD).astype(np.float32)

    ones = np.ones(n_embd, dtype=np.float32)
    writer.add_tensor("token_embd.weight", normal(n_vocab, n_embd))
    writer.add_tensor("output_norm.weight", ones)
    writer.add_tensor("output.weight", normal(n_vocab, n_embd))
    for i in range(n_layer):
        blk = f"blk.{i}"
        writer.add_tensor(f"{blk}.attn_norm.weight", ones)
        writer.add_tensor(f"{blk}.attn_q.weight", normal(n_embd, n_embd))
        writer.add_tensor(f"{blk}.attn_k.weight", normal(n_embd_kv, n_embd))
        writer.add_tensor(f"{blk}.attn_v.weight", normal(n_embd_kv, n_embd))
        writer.add_tensor(f"{blk}.attn_output.weight", normal(n_embd, n_embd))
        writer.add_tensor(f"{blk}.ffn_norm.weight", ones)
        writer.add_tensor(f"{blk}.ffn_gate.weight", normal(n_ff, n_embd))
        writer.add_tensor(f"{blk}.ffn_up.weight", normal(n_ff, n_embd))
        writer.add_tensor(f"{blk}.ffn_down.weight", normal(n_embd, n_ff))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
