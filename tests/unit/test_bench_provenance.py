"""The report's swarmkv_commit: the commit of the checkout the bench ran from, with
uncommitted changes and installed copies said; never a fixed string."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from swarmkv_bench.provenance import swarmkv_commit


def _git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A git repository shaped like SwarmKV's source (src/swarmkv/__init__.py), one commit."""
    repo = tmp_path / "checkout"
    (repo / "src" / "swarmkv").mkdir(parents=True)
    (repo / "src" / "swarmkv" / "__init__.py").write_text("")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    return repo


def test_the_commit_of_the_packages_own_checkout(checkout: Path) -> None:
    head = _git(checkout, "rev-parse", "HEAD")
    package = checkout / "src" / "swarmkv"
    assert swarmkv_commit([package]) == head
    (package / "__init__.py").write_text("changed = 1\n")
    assert swarmkv_commit([package]) == f"{head} (+ uncommitted changes)"


def test_an_installed_copy_names_the_working_directorys_checkout(
    checkout: Path, tmp_path: Path
) -> None:
    site = tmp_path / "site-packages" / "swarmkv"  # a copy: no git around it
    site.mkdir(parents=True)
    got = swarmkv_commit([site, checkout])
    assert got.startswith(_git(checkout, "rev-parse", "HEAD"))
    assert "installed copy" in got and str(checkout) in got


def test_other_repositories_and_no_repository_give_no_commit(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    _git(other, "init", "-q")  # a git tree, but not SwarmKV's source (and no commit)
    got = swarmkv_commit([tmp_path / "nowhere", other])
    assert got.startswith("none found (swarmkv ")
