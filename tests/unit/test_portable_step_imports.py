""".ci/run's portable step runs native tests in a venv with only pytest and gguf beside
SwarmKV: the native tier's conftest must load without the serve and test extras (a CI run
failed on `import openai` there)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXTRAS = ("openai", "httpx", "fastapi", "uvicorn", "schemathesis", "jsonschema")
COLLECT = """
import sys
for name in {extras!r}:
    sys.modules[name] = None  # importing it now raises ImportError, as if not installed
import pytest
sys.exit(pytest.main(["-q", "--collect-only", "-p", "no:cacheprovider", *{files!r}]))
"""


def portable_step_tests() -> list[str]:
    """The test files .ci/run's portable step runs, read from .ci/run itself."""
    text = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    step = text.split('step "portable build"', 1)[1].split("\nfi\n", 1)[0]
    return re.findall(r"tests/\S+\.py", step)


def test_the_portable_steps_tests_collect_without_the_extras() -> None:
    files = portable_step_tests()
    assert files, ".ci/run's portable step runs no test files"
    # no plugins, as in that venv (schemathesis's and hypothesis's would import the extras)
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", COLLECT.format(extras=EXTRAS, files=files)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert "collected" in last and "error" not in last, proc.stdout[-3000:]
