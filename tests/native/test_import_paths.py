"""`import swarmkv` from the repository root: an editable install works, a regular one says how.

Python puts the current folder first on sys.path, so from the root `swarmkv` is the source
folder. With `pip install -e .` the editable finder serves the compiled parts from the build;
with a regular install the source folder has no binding, and the error must name the fix.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROBE = "import swarmkv, swarmkv._native._llama as m; print(swarmkv.__file__); print(m.__file__)"


def test_import_from_repository_root_works_or_names_the_fix() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    if proc.returncode == 0:
        package, binding = proc.stdout.split()
        assert Path(package).resolve().is_relative_to(REPO), "expected the source folder"
        assert Path(binding).exists()
    else:
        assert "compiled binding is missing" in proc.stderr
        assert "pip install -e ." in proc.stderr, proc.stderr[-2000:]


def test_import_from_elsewhere_uses_the_installed_binding(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert Path(proc.stdout.split()[1]).exists()
