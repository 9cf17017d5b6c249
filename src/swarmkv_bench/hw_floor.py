"""The hardware floor of a decode: the least time this CPU needs for it, from its peaks.

A decode of `rows` token rows, `logit_rows` of them asking for logits, must at least
  - multiply every layer weight with every row, and the output projection with every logit
    row: that many int8 multiply-adds at the CPU's peak (hw_peak.py);
  - compute attention: per row, layer and query head, one FMA per key dimension and one per
    value dimension for every cell the row sees, at the peak f32 FMA rate;
  - read every weight matrix once, and the KV cells the rows see once (rows that share a
    prefix share its cells), at the peak read bandwidth.
The floor is the largest of the three: a lower bound, never a measured time. Where the model
does not say something, the count is cut so it stays a lower bound: a sliding-window model's
per-layer pattern is not in its GGUF (llama.cpp hard-codes it), so every layer is counted as
seeing only min(cells, window). Norms, RoPE, activations and the softmax's exponentials are
not counted at all.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from swarmkv.errors import ConfigError

from .hw_peak import HardwarePeaks

# the matrices every decode multiplies with each row, by their GGUF names
LAYER_MATRICES = re.compile(r"blk\.\d+\.(attn_[qkv]|attn_output|ffn_up|ffn_gate|ffn_down)\.weight")


@dataclass(frozen=True)
class ModelShape:
    """What a decode of this model must do per row, from its GGUF."""

    layer_weights: int  # multiply-adds per row in the layers' matrices
    output_weights: int  # per row with logits (the output projection, or the tied embedding)
    weight_bytes: int  # bytes of every matrix a decode reads
    n_layer: int
    n_head: int
    n_head_kv: int
    head_k: int
    head_v: int
    window: int  # sliding window (0: none)

    @classmethod
    def from_gguf(cls, path: Path) -> ModelShape:
        try:
            from gguf import GGUFReader
        except ImportError as exc:
            raise ConfigError(
                "the hardware floor reads the model's GGUF with the gguf package: "
                f"pip install '.[bench]' ({exc})"
            ) from exc

        reader = GGUFReader(str(path))
        arch = str(reader.fields["general.architecture"].contents())

        def meta(key: str, default: int = 0) -> int:
            field = reader.fields.get(f"{arch}.{key}")
            return int(field.contents()) if field is not None else default

        tensors = {t.name: t for t in reader.tensors}
        layers = [t for name, t in tensors.items() if LAYER_MATRICES.fullmatch(name)]
        out = tensors.get("output.weight") or tensors["token_embd.weight"]
        n_head = meta("attention.head_count")
        n_embd = meta("embedding_length")
        return cls(
            layer_weights=sum(int(t.n_elements) for t in layers),
            output_weights=int(out.n_elements),
            weight_bytes=sum(int(t.n_bytes) for t in (*layers, out)),
            n_layer=meta("block_count"),
            n_head=n_head,
            n_head_kv=meta("attention.head_count_kv", n_head),
            head_k=meta("attention.key_length", n_embd // max(n_head, 1)),
            head_v=meta("attention.value_length", n_embd // max(n_head, 1)),
            window=meta("attention.sliding_window"),
        )

    def seen(self, cells: int) -> int:
        """Cells every layer surely reads for a row that sees `cells` (a lower bound)."""
        return min(cells, self.window) if self.window else cells


@dataclass(frozen=True)
class Floor:
    """A decode's three lower bounds and the floor (the largest), in ms."""

    int8_ms: float | None
    fma_ms: float | None
    read_ms: float | None
    floor_ms: float | None
    bound: str  # which one sets the floor

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def decode_floor(
    shape: ModelShape,
    peaks: HardwarePeaks,
    row_cells: list[int],
    logit_rows: int,
    shared_cells: int,
) -> Floor:
    """The floor of one decode whose rows see row_cells[i] cells each, logit_rows of them with
    logits, the rows together reading shared_cells distinct cells (a forked prefix is read
    once for all its branches)."""
    rows = len(row_cells)
    macs = shape.layer_weights * rows + shape.output_weights * logit_rows
    fmas = shape.n_layer * shape.n_head * (shape.head_k + shape.head_v)
    fmas *= sum(shape.seen(c) for c in row_cells)
    kv_bytes = 2 * shape.n_layer * shape.n_head_kv * (shape.head_k + shape.head_v)
    nbytes = shape.weight_bytes + kv_bytes * shape.seen(shared_cells)
    bounds = {
        "int8": macs / (peaks.int8_gmacs * 1e6) if peaks.int8_gmacs else None,
        "fma": fmas / (peaks.fma_gfmas * 1e6) if peaks.fma_gfmas else None,
        "read": nbytes / (peaks.read_gbps * 1e6) if peaks.read_gbps else None,
    }
    known = {k: v for k, v in bounds.items() if v is not None}
    bound = max(known, key=lambda k: known[k]) if known else "none"
    return Floor(
        int8_ms=bounds["int8"],
        fma_ms=bounds["fma"],
        read_ms=bounds["read"],
        floor_ms=known.get(bound),
        bound=bound,
    )
