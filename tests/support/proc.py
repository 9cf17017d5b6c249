"""Starting Python subprocesses that run the installed swarmkv, the one way every test does.

The child gets this folder's parent on PYTHONPATH (so a worker script can import `support`)
and faulthandler on (a crash in llama.cpp prints the Python stack). Its working directory is
the caller's choice; with the src/ layout the repository root holds no importable `swarmkv`,
so even a child started there imports the installed package.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

TESTS_DIR = Path(__file__).resolve().parents[1]


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """os.environ plus `support` importable and faulthandler on, plus extra."""
    env = dict(os.environ)
    paths = [str(TESTS_DIR), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env["PYTHONFAULTHANDLER"] = "1"
    env.update(extra or {})
    return env


def python_cmd(*args: str) -> list[str]:
    """This interpreter with args (a script path, `-c CODE` or `-m MODULE ...`)."""
    return [sys.executable, *args]


def swarmkv_cmd(*args: str) -> list[str]:
    """The `swarmkv` command line of this interpreter's installed package."""
    return python_cmd("-m", "swarmkv", *args)


def run(
    cmd: Sequence[str],
    *,
    cwd: Path | str,
    timeout: float = 300,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run cmd to its end, text output captured; the exit status is the caller's to check."""
    return subprocess.run(
        list(cmd),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env(env),
        input=input,
    )


def popen(
    cmd: Sequence[str], *, cwd: Path | str, env: Mapping[str, str] | None = None
) -> subprocess.Popen[str]:
    """Start cmd with stdout and stderr piped (text), for tests that signal or kill it."""
    return subprocess.Popen(
        list(cmd),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(env),
    )


def stderr_tail(proc: subprocess.CompletedProcess[str], n: int = 3000) -> str:
    """The end of a child's stderr without llama.cpp's own log lines, for failure messages."""
    lines = (ln for ln in (proc.stderr or "").splitlines() if not ln.startswith("llama"))
    return "\n".join(lines)[-n:]


def last_json_line(proc: subprocess.CompletedProcess[str]) -> Any:
    """The child's last stdout line parsed as JSON; a failed child fails with its stderr."""
    assert proc.returncode == 0, f"child exited with {proc.returncode}:\n{stderr_tail(proc)}"
    return json.loads(proc.stdout.strip().splitlines()[-1])
