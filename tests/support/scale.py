"""Loop sizes of the slow tier's fuzz, leak and kill loops, scaled by one variable.

SWARMKV_TEST_SCALE (default 1) multiplies every loop size given to `scaled`; `.ci/run` states
the value CI uses. A size never drops below its floor, the count that still catches what the
loop has caught before (each caller says which).
"""

from __future__ import annotations

import math
import os

ENV = "SWARMKV_TEST_SCALE"


def factor() -> float:
    """The scale factor from SWARMKV_TEST_SCALE; a clear error for a value that is no number."""
    raw = os.environ.get(ENV, "1")
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{ENV}={raw!r} is not a number (try 1, 0.5 or 4)") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{ENV}={raw!r} must be a positive number")
    return value


def scaled(base: int, *, floor: int = 1) -> int:
    """base x the scale factor, rounded, never below floor."""
    return max(floor, round(base * factor()))
