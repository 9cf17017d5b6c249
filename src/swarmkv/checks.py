"""The one validation of user-given values: numbers (their types included), names, text.

Every layer checks what a user hands it with these, before any work starts, so a bad value
gets the same clear ConfigError wherever it enters: `n_predict=1.5` is refused, not rounded
up; `n_predict="4"` names the field, not Python's comparison of str and int.
"""

from __future__ import annotations

import math
import unicodedata

from .errors import ConfigError

# Characters that make a name print as something else: line and paragraph breaks, NUL and
# the other controls, and the invisible format characters (bidi overrides, zero widths).
_HIDDEN = {"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(what: str, value: object, *, lo: int | None = None, hi: int | None = None) -> int:
    """value as an int within [lo, hi]; ConfigError naming `what` for another type (a bool,
    a float such as 1.5 or 4.0, a string) or a value out of range."""
    if not _is_int(value):
        raise ConfigError(f"{what} must be an integer, got {value!r} ({type(value).__name__})")
    assert isinstance(value, int)
    if lo is not None and value < lo:
        raise ConfigError(f"{what} must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise ConfigError(f"{what} must be <= {hi}, got {value}")
    return value


def check_number(
    what: str, value: object, *, lo: float | None = None, hi: float | None = None
) -> float:
    """value as a finite float within [lo, hi]; ints are numbers, bools and strings are not."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ConfigError(f"{what} must be a number, got {value!r} ({type(value).__name__})")
    if not math.isfinite(value):
        raise ConfigError(f"{what} must be a finite number, got {value}")
    if lo is not None and value < lo:
        raise ConfigError(f"{what} must be >= {lo:g}, got {value}")
    if hi is not None and value > hi:
        raise ConfigError(f"{what} must be <= {hi:g}, got {value}")
    return float(value)


def check_seconds(name: str, value: float | None, *, zero_ok: bool = False) -> None:
    """ConfigError unless value is None (no limit) or a finite number of seconds > 0 (>= 0
    with zero_ok: a wait of 0 only polls).

    NaN compares false with every number, so a NaN deadline would silently never fire.
    """
    if value is None:
        return
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        bound = ">= 0" if zero_ok else "> 0"
        raise ConfigError(f"{name} must be a finite number of seconds {bound}, got {value!r}")


def check_name(what: str, name: object) -> str:
    """A name that prints as itself: a non-empty string with no line breaks, NUL, other
    control characters or invisible format characters (bidi overrides), which would make
    `a\\nb` look like two branches in every listing."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{what} must be a non-empty string, got {name!r}")
    for i, ch in enumerate(name):
        if unicodedata.category(ch) in _HIDDEN:
            raise ConfigError(
                f"{what} {name!r} holds an unprintable character at {i} "
                f"(U+{ord(ch):04X} {unicodedata.name(ch, 'control')}): names must print as "
                "themselves"
            )
    return name


def check_utf8(what: str, text: str) -> None:
    """ConfigError when text cannot be UTF-8 (lone surrogates, e.g. from undecodable argv
    bytes): llama.cpp's tokenizer takes UTF-8 only."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(
            f"{what} is not valid UTF-8 text (character {exc.start}: {exc.reason})"
        ) from exc
