"""Every row of the bad-input table (docs/reference/bad-input.md) still holds: each bad
input of bad_input_cases.py, run on the tiny model, gets its kind of error (an exception
class or exit status) and a message naming the cause; no traceback, crash or hang."""

from __future__ import annotations

from pathlib import Path

import pytest
from bad_input_cases import CASES, Case, Work, prepare


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory, tiny_model_path: Path) -> Work:
    w = Work(tmp_path_factory.mktemp("bad-inputs"), tiny_model_path)
    prepare(w)
    return w


@pytest.mark.parametrize("case", CASES, ids=[f"{c.where}: {c.what}" for c in CASES])
def test_bad_input_gets_its_error(case: Case, work: Work) -> None:
    kind, message = case.run(work)
    assert kind == case.expect, message
    assert case.message in message
    assert "Traceback" not in message
