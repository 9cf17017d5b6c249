"""The cffi API-mode binding of libllama and ggml-backend (built by CMakeLists.txt).

Importing this starts llama.cpp: the log callback first, then (portable builds only) the
best CPU backend variant for this machine, loaded from this folder, then llama_backend_init.
`BUILD` holds the build's own settings as compiled in (see build_ffi.py).
"""

from __future__ import annotations

import json
import os
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
from . import _llama as _ext  # noqa: E402
from . import log as _log  # noqa: E402

# The shared libraries sit beside the compiled binding, which an editable install keeps in
# site-packages, apart from this source folder.
LIB_DIR = Path(_ext.__file__).resolve().parent

LLAMA_CPP_COMMIT: str = ffi.string(lib.swarmkv_llama_cpp_commit()).decode()
BUILD: dict[str, Any] = json.loads(ffi.string(lib.swarmkv_build_json()).decode())


# Portable builds: load this CPU variant (libggml-cpu-NAME.so) instead of the best one, and no
# other backend. For testing the kernels of every instruction-set level the machine can run
# (tests/native/test_cpu_variants.py); a native build refuses it.
VARIANT_ENV = "SWARMKV_CPU_VARIANT"


def _load_variant(name: str) -> None:
    path = LIB_DIR / f"libggml-cpu-{name}.so"
    if BUILD["cpu_mode"] != "portable":
        raise ImportError(f"{VARIANT_ENV}={name}: a native build has one CPU backend, no variants")
    if not path.is_file():
        raise ImportError(
            f"{VARIANT_ENV}={name}: no {path.name} in {LIB_DIR} "
            f"(built: {', '.join(BUILD['backend_libraries'])})"
        )
    if lib.ggml_backend_load(str(path).encode()) == ffi.NULL:
        raise ImportError(f"{VARIANT_ENV}={name}: this CPU cannot run {path.name}")


def _load_backends() -> None:
    """Portable builds: register the best CPU variant (and CUDA, if built) from this folder.

    ggml scores every libggml-cpu-*.so here against the running CPU and keeps the best one;
    native builds link their one CPU backend, which ggml registers by itself.
    """
    variant = os.environ.get(VARIANT_ENV)
    if variant:
        _load_variant(variant)
        return
    if BUILD["cpu_mode"] != "portable":
        return
    lib.ggml_backend_load_all_from_path(str(LIB_DIR).encode())
    if lib.ggml_backend_dev_by_type(lib.GGML_BACKEND_DEVICE_TYPE_CPU) == ffi.NULL:
        raise ImportError(
            f"no ggml CPU backend variant in {LIB_DIR} runs on this CPU "
            f"(built: {', '.join(BUILD['backend_libraries'])})"
        )


# The callback first: backend start-up (ggml-cuda's device probe, say) logs too.
_log.install()
_load_backends()
lib.llama_backend_init()

__all__ = ["BUILD", "LLAMA_CPP_COMMIT", "ffi", "lib"]
