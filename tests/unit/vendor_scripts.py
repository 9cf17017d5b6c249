"""Import the build-time scripts under vendor/ (they are not part of the installed package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

VENDOR = Path(__file__).resolve().parents[2] / "vendor"


def load(name: str) -> ModuleType:
    """vendor/NAME.py as a module, loaded once."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, VENDOR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
