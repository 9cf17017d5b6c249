"""The cffi API-mode binding of libllama and ggml-backend (built by CMakeLists.txt).

Only swarmkv.llama, swarmkv.pool and swarmkv.handoff import this package.
"""

from __future__ import annotations

from pathlib import Path

try:
    from ._llama import ffi, lib
except ImportError as exc:  # pragma: no cover - depends on how swarmkv was installed
    _here = Path(__file__).resolve().parent
    raise ImportError(
        f"swarmkv's compiled binding is missing from {_here} ({exc}). Install the package "
        "with `pip install .` and run from outside the source tree (or use `pytest`, which "
        "does not put the source tree first on sys.path)."
    ) from exc

from . import log as _log

LLAMA_CPP_COMMIT: str = ffi.string(lib.swarmkv_llama_cpp_commit()).decode()

# The callback first: backend start-up (ggml-cuda's device probe, say) logs too.
_log.install()
lib.llama_backend_init()

__all__ = ["LLAMA_CPP_COMMIT", "ffi", "lib"]
