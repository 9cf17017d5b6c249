"""The cffi API-mode binding of libllama and ggml-backend (built by CMakeLists.txt).

Importing this starts llama.cpp: the log callback first, then (portable builds only) the
best CPU backend variant for this machine, loaded from this folder, then llama_backend_init.
`BUILD` holds the build's own settings as compiled in (see build_ffi.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

try:
    from ._llama import ffi, lib
except ImportError as exc:  # pragma: no cover - depends on how swarmkv was installed
    raise ImportError(
        f"swarmkv's compiled binding is missing from {HERE} ({exc}). This is the source "
        "folder (src/swarmkv), not an installed package: `pip install .` (or `pip install -e "
        ".` to edit the code in place) builds and installs it."
    ) from exc

# After the try: log imports _llama too, and the message above must be the one a user sees.
from . import log as _log  # noqa: E402

LLAMA_CPP_COMMIT: str = ffi.string(lib.swarmkv_llama_cpp_commit()).decode()
BUILD: dict[str, Any] = json.loads(ffi.string(lib.swarmkv_build_json()).decode())


def _load_backends() -> None:
    """Portable builds: register the best CPU variant (and CUDA, if built) from this folder.

    ggml scores every libggml-cpu-*.so here against the running CPU and keeps the best one;
    native builds link their one CPU backend, which ggml registers by itself.
    """
    if BUILD["cpu_mode"] != "portable":
        return
    lib.ggml_backend_load_all_from_path(str(HERE).encode())
    if lib.ggml_backend_dev_by_type(lib.GGML_BACKEND_DEVICE_TYPE_CPU) == ffi.NULL:
        raise ImportError(
            f"no ggml CPU backend variant in {HERE} runs on this CPU "
            f"(built: {', '.join(BUILD['backend_libraries'])})"
        )


# The callback first: backend start-up (ggml-cuda's device probe, say) logs too.
_log.install()
_load_backends()
lib.llama_backend_init()

__all__ = ["BUILD", "LLAMA_CPP_COMMIT", "ffi", "lib"]
