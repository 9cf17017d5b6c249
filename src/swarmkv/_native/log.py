"""Route llama.cpp's and ggml's log output to `logging.getLogger("swarmkv.llama")`.

llama.cpp emits a line in several calls (GGML_LOG_LEVEL_CONT continues the previous one), so
pieces are buffered until a newline and then logged once, at the level of the first piece.
"""

from __future__ import annotations

import logging
import threading

from ._llama import ffi, lib

logger = logging.getLogger("swarmkv.llama")

_LEVELS = {
    lib.GGML_LOG_LEVEL_DEBUG: logging.DEBUG,
    lib.GGML_LOG_LEVEL_INFO: logging.INFO,
    lib.GGML_LOG_LEVEL_WARN: logging.WARNING,
    lib.GGML_LOG_LEVEL_ERROR: logging.ERROR,
}

_pending = threading.local()


@ffi.def_extern()
def swarmkv_log_callback(level: int, text: object, user_data: object) -> None:
    """The ggml_log_callback given to llama_log_set: buffers pieces, logs whole lines."""
    # Must never raise: an exception here would be printed by cffi, not propagated.
    try:
        piece = ffi.string(text).decode("utf-8", errors="replace")
        buf: list[str] = getattr(_pending, "buf", [])
        if level != lib.GGML_LOG_LEVEL_CONT or not buf:
            _pending.level = _LEVELS.get(level, logging.DEBUG)
        buf.append(piece)
        _pending.buf = buf
        if piece.endswith("\n"):
            line = "".join(buf).rstrip("\n")
            _pending.buf = []
            if line:
                logger.log(_pending.level, "%s", line)
    except Exception:
        pass


def install() -> None:
    """Point llama.cpp (and through it ggml) at the Python callback."""
    lib.llama_log_set(lib.swarmkv_log_callback, ffi.NULL)
