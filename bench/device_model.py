#!/usr/bin/env python3
"""A random-weight GGUF shaped like Qwen2.5-7B (or a small one of the same kind), Q4_K_M,
for timing SwarmKV on a machine that cannot download the paper's model (bench/device_check.sh).

    python bench/device_model.py OUT.gguf [--shape qwen2.5-7b|small] [--seed 0]

The architecture is llama.cpp's `qwen2` with Qwen2.5-7B's shape (28 layers, hidden 3584, 28
query and 4 KV heads of 128, feed-forward 18944, the q/k/v biases) and the Qwen2 vocabulary
of the pinned tree's vocab-only GGUF (models/ggml-vocab-qwen2.gguf), so tokenizing is real.
The weights are random quantized blocks written as they are stored (no quantizing step):
Q4_K for most matrices and Q6_K for the output projection, attn_v and ffn_down, as
llama.cpp's Q4_K_M recipe leans, each block's scales small and finite so activations stay
bounded through the layers. The timing is what matters; the text it writes is noise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the tiny models' vocab reader (support.tinymodel)

SHAPES = {
    "qwen2.5-7b": {"n_layer": 28, "n_embd": 3584, "n_head": 28, "n_head_kv": 4, "n_ff": 18944},
    "small": {"n_layer": 2, "n_embd": 256, "n_head": 4, "n_head_kv": 2, "n_ff": 512},
}
# bytes per 256-weight super-block and where each block's f16 scales sit
Q4_K = (144, (0, 2))  # d, dmin first
Q6_K = (210, (208,))  # d last
SCALE_BYTES = np.array([0x1A, 0x05], dtype=np.uint8)  # f16 ~1.0e-4: small and finite


def quantized(rng: np.random.Generator, rows: int, cols: int, kind: tuple) -> np.ndarray:
    """Random super-blocks of one matrix: [rows, cols / 256 * block bytes] uint8."""
    nbytes, scales = kind
    blocks = rng.integers(0, 256, size=(rows * cols // 256, nbytes), dtype=np.uint8)
    for at in scales:
        blocks[:, at : at + 2] = SCALE_BYTES
    return blocks.reshape(rows, cols // 256 * nbytes)


def write_model(out: Path, shape: dict[str, int], seed: int, vocab: Path) -> Path:
    """Write the model to out; return it."""
    from gguf import GGMLQuantizationType, GGUFWriter

    from support.tinymodel import _tokenizer_fields

    tok = _tokenizer_fields(str(vocab.resolve()))
    n_vocab = next(len(v) for k, v, *_ in tok if k == "tokenizer.ggml.tokens")
    n_embd, n_layer, n_ff = shape["n_embd"], shape["n_layer"], shape["n_ff"]
    head = n_embd // shape["n_head"]
    n_kv = head * shape["n_head_kv"]
    w = GGUFWriter(out, "qwen2")
    w.add_name(f"swarmkv-random-qwen2-{n_layer}x{n_embd}-seed{seed}")
    hparams = {
        w.add_context_length: 32768,
        w.add_embedding_length: n_embd,
        w.add_block_count: n_layer,
        w.add_feed_forward_length: n_ff,
        w.add_head_count: shape["n_head"],
        w.add_head_count_kv: shape["n_head_kv"],
        w.add_layer_norm_rms_eps: 1e-6,
        w.add_rope_freq_base: 1e6,
        w.add_vocab_size: n_vocab,
        w.add_file_type: 15,  # MOSTLY_Q4_K_M
    }
    for add, value in hparams.items():
        add(value)
    for key, value, vtype, sub_type in tok:
        w.add_key_value(key, value, vtype, sub_type)
    rng = np.random.default_rng(seed)

    def matrix(name: str, rows: int, cols: int, kind: tuple = Q4_K) -> None:
        qtype = GGMLQuantizationType.Q4_K if kind is Q4_K else GGMLQuantizationType.Q6_K
        w.add_tensor(name, quantized(rng, rows, cols, kind), raw_dtype=qtype)  # shape from bytes

    def vector(name: str, n: int, value: float) -> None:
        w.add_tensor(name, np.full(n, value, dtype=np.float32))

    matrix("token_embd.weight", n_vocab, n_embd)
    vector("output_norm.weight", n_embd, 1.0)
    matrix("output.weight", n_vocab, n_embd, Q6_K)
    for i in range(n_layer):
        b = f"blk.{i}"
        vector(f"{b}.attn_norm.weight", n_embd, 1.0)
        matrix(f"{b}.attn_q.weight", n_embd, n_embd)
        matrix(f"{b}.attn_k.weight", n_kv, n_embd)
        matrix(f"{b}.attn_v.weight", n_kv, n_embd, Q6_K)
        for part, n in (("q", n_embd), ("k", n_kv), ("v", n_kv)):
            vector(f"{b}.attn_{part}.bias", n, 0.0)
        matrix(f"{b}.attn_output.weight", n_embd, n_embd)
        vector(f"{b}.ffn_norm.weight", n_embd, 1.0)
        matrix(f"{b}.ffn_gate.weight", n_ff, n_embd)
        matrix(f"{b}.ffn_up.weight", n_ff, n_embd)
        matrix(f"{b}.ffn_down.weight", n_embd, n_ff, Q6_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-7b")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--vocab", type=Path, default=ROOT / "vendor/llama.cpp/models/ggml-vocab-qwen2.gguf"
    )
    args = ap.parse_args()
    if not args.vocab.is_file():
        ap.error(f"no vocabulary at {args.vocab} (the pinned tree's models/ggml-vocab-qwen2.gguf)")
    path = write_model(args.out, SHAPES[args.shape], args.seed, args.vocab)
    print(f"{path} ({path.stat().st_size / 2**30:.2f} GiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
