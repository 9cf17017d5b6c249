"""The whole suite's one hook: remember every collected test before `-m` deselects any, so
tests/unit/test_tiers.py can check that the tiers together select all of them."""

from __future__ import annotations

import pytest

from support.tiers import COLLECTED


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # tryfirst: before the mark plugin drops the tests `-m` does not select. The items are
    # kept, not their markers: tier markers added by later hooks are read when the check runs.
    config.stash[COLLECTED] = list(items)
