"""The whole suite's hooks: remember every collected test before `-m` deselects any, so
tests/unit/test_tiers.py can check that the tiers together select all of them; and give the
session Python's own Ctrl-C handler when it was started with SIGINT ignored."""

from __future__ import annotations

import signal

import pytest

from support.tiers import COLLECTED


def pytest_configure(config: pytest.Config) -> None:
    # A run started in the background by a shell without job control (`(pytest &)`, some CI
    # runners) inherits SIGINT ignored, and Python then keeps ignoring it, so the tests that
    # send Ctrl-C to this process or to a child (which inherits the disposition) would see
    # nothing. A terminal run has Python's handler: install it, and a child then gets SIGINT's
    # default disposition at exec.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # tryfirst: before the mark plugin drops the tests `-m` does not select. The items are
    # kept, not their markers: tier markers added by later hooks are read when the check runs.
    config.stash[COLLECTED] = list(items)
