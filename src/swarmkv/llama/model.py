"""Model: one loaded GGUF model (llama_model), shared read-only by its contexts.

Ownership (see owned.py): a Model is freed by llama_model_free once closed and no context
made from it remains; `close()` refuses while such a context is open. Every input is validated
before the native call, so bad input raises a SwarmKVError and never reaches a C++ exception.
"""

from __future__ import annotations

import hashlib
import os
import threading
import weakref
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._native import ffi, lib
from ..errors import (
    ClosedError,
    ConfigError,
    ModelLoadError,
    NativeCallError,
    SwarmKVError,
)
from .cpu_backend import repack_without_invariance
from .owned import Owned

if TYPE_CHECKING:
    from .context import Context

GGUF_MAGIC = b"GGUF"
# Past this size a model file is fingerprinted by samples, not hashed whole (see fingerprint).
_FINGERPRINT_SAMPLE = 64 << 10


def _check_gguf_file(path: Path) -> None:
    if not path.exists():
        raise ModelLoadError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelLoadError(f"model path is not a file: {path}")
    # read here, not first in llama.cpp: an unreadable file (permissions, I/O error) then
    # gets a ModelLoadError naming it instead of a PermissionError traceback
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise ModelLoadError(f"cannot read model file {path}: {exc.strerror or exc}") from exc
    if magic != GGUF_MAGIC:
        raise ModelLoadError(f"{path} is not a GGUF file (magic {magic!r}, size {size} bytes)")


# llama.h's enum llama_vocab_type, by value
_VOCAB_TYPES = {
    lib.LLAMA_VOCAB_TYPE_NONE: "none",
    lib.LLAMA_VOCAB_TYPE_SPM: "spm",
    lib.LLAMA_VOCAB_TYPE_BPE: "bpe",
    lib.LLAMA_VOCAB_TYPE_WPM: "wpm",
    lib.LLAMA_VOCAB_TYPE_UGM: "ugm",
    lib.LLAMA_VOCAB_TYPE_RWKV: "rwkv",
    lib.LLAMA_VOCAB_TYPE_PLAMO2: "plamo2",
}
# the llama_token_attr bits of tokens that strip the whitespace beside them
TOKEN_ATTR_STRIP = int(lib.LLAMA_TOKEN_ATTR_LSTRIP | lib.LLAMA_TOKEN_ATTR_RSTRIP)


class Model(Owned):
    """A GGUF model loaded by llama.cpp. Thread-safe to share between contexts.

    The weights are used as stored (llama_model_params.use_extra_bufts = false), the layout
    SwarmKV's batch-invariant kernels are written for. repack=True moves the weights the CPU
    backend's extra buffer types take into them (CPU_REPACK: Q4_0, Q4_K, ... interleaved for
    its gemm): llama.cpp's fastest plain kernels (Pipeline(exact=False)). Batch-invariant
    contexts take CPU_REPACK's weights too (patch 0011) but refuse AMX's or KleidiAI's
    (docs/concepts/exactness.md).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        n_gpu_layers: int | None = None,
        repack: bool = False,
    ) -> None:
        self.path = Path(path).expanduser().resolve()
        _check_gguf_file(self.path)
        self.repack = repack
        # the buffer types this model's weights may be repacked into whose kernels have no
        # batch-invariant mode (AMX, KleidiAI): batch-invariant contexts refuse the model
        self.repacked_without_invariance: tuple[str, ...] = (
            tuple(repack_without_invariance()) if repack else ()
        )
        params = lib.llama_model_default_params()
        params.use_extra_bufts = repack
        if n_gpu_layers is not None:
            params.n_gpu_layers = int(n_gpu_layers)
        ptr = lib.llama_model_load_from_file(str(self.path).encode(), params)
        if ptr == ffi.NULL:
            raise ModelLoadError(
                f"llama_model_load_from_file failed for {self.path} "
                f"({self.path.stat().st_size} bytes): truncated, corrupt or unsupported GGUF; "
                "see the swarmkv.llama log for llama.cpp's reason"
            )
        self._ptr: Any = ptr
        self._vocab = lib.llama_model_get_vocab(ptr)
        self._own(lib.llama_model_free, ptr)
        # contexts are made on node threads while another thread may close the model: the
        # set is read and changed under this lock only
        self._contexts_lock = threading.Lock()
        self._contexts: weakref.WeakSet[Context] = weakref.WeakSet()

    def _add_context(self, ctx: Context) -> None:
        """Count ctx among this model's contexts (close() refuses while it is open);
        ClosedError if the model was closed meanwhile (ctx then holds its handle still)."""
        with self._contexts_lock:
            if self.closed:
                raise ClosedError("Model is closed")
            self._contexts.add(ctx)

    def close(self) -> None:
        """Free the model; refused (SwarmKVError) while a context made from it is open.

        Each context also holds the model's native handle, so even a context that was never
        closed cannot see the model freed under it. Safe against contexts made or closed on
        other threads meanwhile: one made after this returns gets ClosedError.
        """
        with self._contexts_lock:
            open_contexts = [c for c in list(self._contexts) if not c.closed]
            if open_contexts:
                raise SwarmKVError(
                    f"Model.close(): {len(open_contexts)} context(s) made from "
                    f"{self.path.name} are still open; close them first"
                )
            super().close()

    # -- lifetime -------------------------------------------------------------------------
    @property
    def ptr(self) -> Any:
        """The llama_model pointer; raises ClosedError once the model is closed."""
        return self._live(self._ptr)

    @property
    def vocab(self) -> Any:
        """The model's llama_vocab pointer (llama_model_get_vocab); ClosedError once closed."""
        return self._live(self._vocab)

    # -- shape ----------------------------------------------------------------------------
    @property
    def n_layer(self) -> int:
        """Number of layers (llama_model_n_layer)."""
        return int(lib.llama_model_n_layer(self.ptr))

    @property
    def n_embd(self) -> int:
        """Embedding size (llama_model_n_embd)."""
        return int(lib.llama_model_n_embd(self.ptr))

    @property
    def n_head(self) -> int:
        """Number of attention heads (llama_model_n_head)."""
        return int(lib.llama_model_n_head(self.ptr))

    @property
    def n_head_kv(self) -> int:
        """Number of key/value attention heads (llama_model_n_head_kv)."""
        return int(lib.llama_model_n_head_kv(self.ptr))

    @property
    def n_vocab(self) -> int:
        """Vocabulary size in tokens (llama_vocab_n_tokens)."""
        return int(lib.llama_vocab_n_tokens(self.vocab))

    @property
    def n_ctx_train(self) -> int:
        """Context length the model was trained with, in tokens (llama_model_n_ctx_train)."""
        return int(lib.llama_model_n_ctx_train(self.ptr))

    @property
    def n_swa(self) -> int:
        """Sliding-window size in tokens; 0 for models without sliding-window attention."""
        return int(lib.llama_model_n_swa(self.ptr))

    @property
    def size_bytes(self) -> int:
        """Total size of the model's tensors in bytes (llama_model_size)."""
        return int(lib.llama_model_size(self.ptr))

    @property
    def n_params(self) -> int:
        """Number of model parameters (llama_model_n_params)."""
        return int(lib.llama_model_n_params(self.ptr))

    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as a string, or None when the key is absent."""
        buf = ffi.new("char[]", 4096)
        n = lib.llama_model_meta_val_str(self.ptr, key.encode(), buf, 4096)
        return None if n < 0 else ffi.string(buf).decode("utf-8", errors="replace")

    @property
    def architecture(self) -> str:
        """The GGUF general.architecture value, or "unknown" when the key is absent."""
        return self.meta("general.architecture") or "unknown"

    @property
    def description(self) -> str:
        """Model type, size and quantization as text (llama_model_desc), at most 255 bytes."""
        buf = ffi.new("char[]", 256)
        lib.llama_model_desc(self.ptr, buf, 256)
        return ffi.string(buf).decode("utf-8", errors="replace")

    def head_dims(self) -> tuple[int, int]:
        """(key, value) head size, from metadata where the architecture states it."""
        arch = self.architecture
        default = self.n_embd // max(self.n_head, 1)
        k = self.meta(f"{arch}.attention.key_length")
        v = self.meta(f"{arch}.attention.value_length")
        return (int(k) if k else default, int(v) if v else default)

    @cached_property
    def fingerprint(self) -> str:
        """Identifies the weights: sha256 of the file size, GGUF header and sampled blocks.

        Hashing all of a multi-GB file would cost seconds per process; the header (which
        holds every tensor's name, shape, type and offset) plus 64 evenly spaced 64 KiB
        samples of the data distinguishes real models at a cost of milliseconds.
        """
        digest = hashlib.sha256()
        size = self.path.stat().st_size
        digest.update(size.to_bytes(8, "little"))
        with self.path.open("rb") as f:
            digest.update(f.read(4 << 20))
            for i in range(64):
                f.seek(size * i // 64)
                digest.update(f.read(_FINGERPRINT_SAMPLE))
        return digest.hexdigest()

    # -- tokenizer ------------------------------------------------------------------------
    @property
    def bos(self) -> int | None:
        """Beginning-of-sequence token id (llama_vocab_bos), or None when the vocab has none."""
        tok = int(lib.llama_vocab_bos(self.vocab))
        return None if tok < 0 else tok

    @property
    def eos(self) -> int | None:
        """End-of-sequence token id (llama_vocab_eos), or None when the vocab has none."""
        tok = int(lib.llama_vocab_eos(self.vocab))
        return None if tok < 0 else tok

    @property
    def add_bos(self) -> bool:
        """Whether tokenizing with add_special prepends BOS (llama_vocab_get_add_bos)."""
        return bool(lib.llama_vocab_get_add_bos(self.vocab))

    @property
    def add_eos(self) -> bool:
        """Whether tokenizing with add_special appends EOS (llama_vocab_get_add_eos)."""
        return bool(lib.llama_vocab_get_add_eos(self.vocab))

    @property
    def vocab_type(self) -> str:
        """The tokenizer's kind (llama_vocab_type): "spm", "bpe", "wpm", "ugm", "rwkv", ..."""
        kind = int(lib.llama_vocab_type(self.vocab))
        return _VOCAB_TYPES.get(kind, f"type {kind}")

    def vocab_texts(self) -> list[str]:
        """Every token's text as the tokenizer matches it (llama_vocab_get_text), by id:
        SentencePiece's spaces are U+2581; bytes that are not UTF-8 come back as U+FFFD."""
        vocab = self.vocab
        get = lib.llama_vocab_get_text
        return [
            ffi.string(get(vocab, t)).decode("utf-8", errors="replace") for t in range(self.n_vocab)
        ]

    def vocab_attrs(self) -> list[int]:
        """Every token's llama_token_attr bits (llama_vocab_get_attr), by id."""
        vocab = self.vocab
        return [int(lib.llama_vocab_get_attr(vocab, t)) for t in range(self.n_vocab)]

    def is_eog(self, token: int) -> bool:
        """Whether token ends generation, e.g. EOS or EOT (llama_vocab_is_eog).

        Raises ConfigError before the native call if token is outside [0, n_vocab).
        """
        self._check_token(token)
        return bool(lib.llama_vocab_is_eog(self.vocab, token))

    def _check_token(self, token: int) -> None:
        if not 0 <= token < self.n_vocab:
            raise ConfigError(f"token id {token} is outside the vocabulary [0, {self.n_vocab})")

    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = False
    ) -> list[int]:
        """Token ids of `text`; `add_special` adds BOS (and EOS) where the model asks for it."""
        raw = text.encode("utf-8")
        cap = len(raw) + 8
        for _ in range(2):
            out = ffi.new("llama_token[]", cap)
            n = lib.llama_tokenize(self.vocab, raw, len(raw), out, cap, add_special, parse_special)
            if n >= 0:
                return list(out[0:n])
            if n == -(2**31):
                raise NativeCallError("llama_tokenize", n, "token count overflows int32")
            cap = -n
        raise NativeCallError("llama_tokenize", n, f"needed {cap} tokens twice")

    def token_to_piece(self, token: int, *, special: bool = False) -> bytes:
        """The bytes of one token (may be part of a UTF-8 character)."""
        self._check_token(token)
        cap = 64
        for _ in range(2):
            buf = ffi.new("char[]", cap)
            n = lib.llama_token_to_piece(self.vocab, token, buf, cap, 0, special)
            if n >= 0:
                return bytes(ffi.buffer(buf, n))
            cap = -n
        raise NativeCallError("llama_token_to_piece", n, f"token {token}")

    def detokenize(
        self, tokens: list[int], *, remove_special: bool = False, unparse_special: bool = False
    ) -> str:
        """Text of tokens (llama_detokenize); invalid UTF-8 is replaced, not raised.

        Raises ConfigError before any native call if a token id is outside [0, n_vocab);
        NativeCallError if llama_detokenize still fails after one retry at the size it asked for.
        """
        for tok in tokens:
            self._check_token(tok)
        arr = ffi.new("llama_token[]", tokens) if tokens else ffi.NULL
        cap = max(16, 8 * len(tokens))
        for _ in range(2):
            buf = ffi.new("char[]", cap)
            n = lib.llama_detokenize(
                self.vocab, arr, len(tokens), buf, cap, remove_special, unparse_special
            )
            if n >= 0:
                return bytes(ffi.buffer(buf, n)).decode("utf-8", errors="replace")
            cap = -n
        raise NativeCallError("llama_detokenize", n, f"{len(tokens)} tokens")
