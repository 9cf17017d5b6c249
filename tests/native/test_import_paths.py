"""`import swarmkv` from the repository root imports the installed package (src/ layout).

Python puts the current folder first on sys.path. The repository root holds no `swarmkv`
folder (the source is under src/), so a command started there, as the README's commands
are, imports the installed package with its compiled binding, never a source folder.
"""

from __future__ import annotations

from pathlib import Path

from support.proc import python_cmd, run, stderr_tail

REPO = Path(__file__).resolve().parents[2]
PROBE = "import swarmkv, swarmkv._native._llama as m; print(swarmkv.__file__); print(m.__file__)"


def test_the_repository_root_holds_no_importable_package() -> None:
    assert not (REPO / "swarmkv").exists() and not (REPO / "swarmkv_bench").exists()
    assert (REPO / "src" / "swarmkv" / "__init__.py").is_file()


def test_import_from_the_repository_root_gets_the_compiled_binding() -> None:
    proc = run(python_cmd("-c", PROBE), cwd=REPO, timeout=120)
    assert proc.returncode == 0, stderr_tail(proc)
    package, binding = proc.stdout.split()
    assert Path(binding).exists()
    # a regular install lives outside the checkout; an editable one serves src/ itself
    assert not Path(package).resolve().is_relative_to(REPO) or Path(
        package
    ).resolve().is_relative_to(REPO / "src"), package


def test_import_from_elsewhere_uses_the_installed_binding(tmp_path: Path) -> None:
    proc = run(python_cmd("-c", PROBE), cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, stderr_tail(proc)
    assert Path(proc.stdout.split()[1]).exists()
