"""The package's layers (src/swarmkv/__init__.py) and its pure modules, as import-linter
contracts in pyproject.toml: every import, function-level ones included, is checked."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = [
    "cli", "dist", "swarm", "pipeline", "serve", "engine", "kv", "llama", "_native", "process",
]  # fmt: skip


def lint_imports(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe is not None, "import-linter is part of the [test] extra"
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_every_contract_is_kept() -> None:
    proc = lint_imports()
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "BROKEN" not in proc.stdout


def test_the_folders_are_the_layers() -> None:
    """A newcomer sees the layers from the folder names: one folder each, nothing else
    beside them but the shared vocabulary (errors, checks, the version)."""
    pkg = ROOT / "src" / "swarmkv"
    folders = sorted(p.name for p in pkg.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders == sorted(LAYERS)
    modules = sorted(p.name for p in pkg.glob("*.py"))
    assert modules == ["__init__.py", "__main__.py", "_version.py", "checks.py", "errors.py"]


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("swarmkv.llama.model", "from swarmkv.pipeline import builder", "layers"),
        ("swarmkv.pipeline.spec", "from swarmkv.llama import context", "pure modules"),
    ],
)
def test_a_violation_breaks_its_contract(
    tmp_path: Path, module: str, line: str, contract: str
) -> None:
    """The contracts can fail: a copy of the package with one import added upward (or into
    the native binding) is refused, naming that import."""
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = src / (module.replace(".", "/") + ".py")
    violation = f"\n\ndef _violation() -> None:\n    {line}\n"
    target.write_text(target.read_text() + violation)
    # python -S: no .pth files, so an editable install's import hook cannot hide the copy
    site_dirs = [p for p in sys.path if p.endswith("site-packages")]
    code = (
        f"import sys; sys.path[:0] = [{str(src)!r}]; sys.path += {site_dirs!r}\n"
        "from importlinter.cli import lint_imports\n"
        "sys.exit(lint_imports(no_cache=True, no_logo=True))"
    )
    proc = subprocess.run(
        [sys.executable, "-S", "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert module in proc.stdout and contract in proc.stdout.lower()


WEB = {"fastapi", "starlette", "uvicorn", "prometheus_client", "pydantic"}


def _web_imports(path: Path) -> list[str]:
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        found += [f"{path.name}:{node.lineno} {n}" for n in names if n.split(".")[0] in WEB]
    return found


def test_only_the_http_layer_imports_the_web_framework() -> None:
    """The core never imports FastAPI, uvicorn or prometheus-client (the [serve] extra):
    only serve/http does, and `swarmkv serve` loads uvicorn when it runs."""
    pkg = ROOT / "src/swarmkv"
    outside = [
        hit
        for path in pkg.rglob("*.py")
        if "http" not in path.relative_to(pkg).parts[:2]
        for hit in _web_imports(path)
    ]
    assert outside and all(h.startswith("serve.py:") and h.endswith(" uvicorn") for h in outside)
    assert _web_imports(pkg / "serve/http/app.py"), "the check must see the HTTP layer's"
