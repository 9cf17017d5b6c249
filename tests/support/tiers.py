"""Where the suite keeps every collected test, before `-m` deselects any (tests/conftest.py
fills it; tests/unit/test_tiers.py reads it)."""

from __future__ import annotations

import pytest

COLLECTED = pytest.StashKey[list[pytest.Item]]()
