"""exact=None, the default: batch-invariant kernels wherever every backend has them.

Batch invariance is a mode of the CPU backend only (SwarmKV's patch 0003); a context that
also holds a GPU or an accelerator backend (CUDA, BLAS) has no such mode. A context gets a
backend for every GPU device the model was loaded for and every accelerator registered, so
the registered devices decide: only CPU devices means exact, anything else means plain.
`exact=True` insists (a GPU context then refuses it with a ConfigError); `exact=False` always
takes llama.cpp's fastest kernels. A batch-invariant mode for the CUDA backend is llama.cpp
PR 16016's subject upstream (open), not SwarmKV's.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from .._native import ffi, lib
from ..errors import ConfigError
from .model import Model
from .models import default_model_path

log = logging.getLogger("swarmkv.llama")


@dataclass(frozen=True)
class ExactChoice:
    """What exact=None (or an explicit value) came to, and why."""

    exact: bool
    reason: str


def devices_without_invariance() -> list[str]:
    """Names of the registered devices whose backend has no batch-invariant mode (every
    device but the CPU's), as ggml lists them."""
    names = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        if lib.ggml_backend_dev_type(dev) != lib.GGML_BACKEND_DEVICE_TYPE_CPU:
            names.append(ffi.string(lib.ggml_backend_dev_name(dev)).decode(errors="replace"))
    return names


def resolve_exact(exact: bool | None, model: Model | None = None) -> ExactChoice:
    """exact as given, or for None: True when every backend has a batch-invariant mode and
    the model's weights, if repacked, went to buffers whose kernels have one (CPU_REPACK's).
    exact=True with a device that has no such mode is a ConfigError here, before any model
    or context is made."""
    if exact is False:
        return ExactChoice(False, "exact=False asked for")
    others = devices_without_invariance()
    if exact:
        if others:
            raise ConfigError(
                f"exact=True: {', '.join(others)} has no batch-invariant mode (it exists for "
                "the CPU backend only; llama.cpp PR 16016 is the upstream effort for CUDA): "
                "pass exact=None (the default) or exact=False (--no-exact)"
            )
        return ExactChoice(True, "asked for")
    if others:
        choice = ExactChoice(False, f"{', '.join(others)} has no batch-invariant mode")
    elif model is not None and (slow := model.repacked_without_invariance):
        choice = ExactChoice(
            False, f"{model.path.name} was repacked for {', '.join(slow)} (no batch-invariant mode)"
        )
    else:
        choice = ExactChoice(True, "every backend is the CPU's")
    log.info("exact=None: %s kernels (%s)", "batch-invariant" if choice.exact else "plain",
             choice.reason)  # fmt: skip
    return choice


def model_for(
    model: Model | str | os.PathLike[str] | None, exact: bool | None
) -> tuple[Model, ExactChoice]:
    """The model to run (the one given, or loaded from a path or the default one) and what
    exact came to. A model loaded here is repacked only for plain kernels (the invariant ones
    are written for weights as stored: patches 0004 and 0008); the caller owns it."""
    if isinstance(model, Model):
        return model, resolve_exact(exact, model)
    choice = resolve_exact(exact)
    return Model(model or default_model_path(), repack=not choice.exact), choice
