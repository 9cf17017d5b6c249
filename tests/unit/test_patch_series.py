"""vendor/patches as a documented series: every patch a mail with its reasons, the series file
names the order, it applies to a fresh tree of the pinned commit, and one that does not apply
is named with its hunk. The tree itself is checked against the lock's commit
(vendor/tree_commit.py), here on small git repositories and on the real archive."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from vendor_scripts import VENDOR, load

series = load("patch_series")
tree_commit = load("tree_commit")
fetch = load("fetch_llama_cpp")

SECTIONS = ("Why:", "What it changes:", "Switch:", "Tests:", "Upstream:")


def test_every_patch_is_a_mail_that_says_why_what_switch_tests_and_upstream() -> None:
    patches = series.read_series()
    assert patches, "the series is empty"
    for n, patch in enumerate(patches, start=1):
        text = patch.read_text()
        head, _, _ = text.partition("\ndiff --git ")
        assert text.startswith("From 0000000000000000000000000000000000000000 "), patch.name
        # git format-patch pads the number to the width of the count: [PATCH 01/10]
        number = f"{n:0{len(str(len(patches)))}d}/{len(patches)}"
        assert re.search(rf"^Subject: \[PATCH {number}\] \S", head, re.M), patch.name
        for section in SECTIONS:
            assert re.search(rf"^{re.escape(section)} \S", head, re.M), (patch.name, section)
        assert patch.name.startswith(f"{n:04d}-"), "file names follow the series order"


def test_every_test_a_patch_names_exists() -> None:
    repo = VENDOR.parent
    for patch in series.read_series():
        head = patch.read_text().partition("\ndiff --git ")[0]
        tests = head.split("\nTests:", 1)[1].split("\nUpstream:", 1)[0]
        named = set(re.findall(r"(tests/[\w/]+\.py|bench/\w+\.py)", tests.replace("\n", "")))
        assert named, f"{patch.name} names no test"
        for path in named:
            assert (repo / path).is_file(), f"{patch.name} names {path}, which does not exist"


def _folder(tmp_path: Path, names: list[str], series_lines: list[str]) -> Path:
    folder = tmp_path / "patches"
    folder.mkdir()
    for name in names:
        (folder / name).write_text("")
    (folder / "series").write_text("# order\n" + "".join(f"{ln}\n" for ln in series_lines))
    return folder


@pytest.mark.parametrize(
    ("names", "lines", "error"),
    [
        (["0001-a.patch", "0002-b.patch"], ["0001-a.patch"], "0002-b.patch in .* is not named"),
        (["0001-a.patch"], ["0001-a.patch", "0002-b.patch"], "names 0002-b.patch, which is not"),
        (["0001-a.patch"], ["0001-a.patch", "0001-a.patch"], "names 0001-a.patch more than once"),
    ],
)
def test_a_series_file_that_disagrees_with_the_folder_is_refused(
    tmp_path: Path, names: list[str], lines: list[str], error: str
) -> None:
    with pytest.raises(series.PatchError, match=error):
        series.read_series(_folder(tmp_path, names, lines))


def test_the_series_is_read_in_its_order_not_by_name(tmp_path: Path) -> None:
    folder = _folder(tmp_path, ["0001-a.patch", "0002-b.patch"], ["0002-b.patch", "0001-a.patch"])
    assert [p.name for p in series.read_series(folder)] == ["0002-b.patch", "0001-a.patch"]


def test_a_hunk_that_does_not_apply_is_named_and_the_tree_is_left_as_it_was(
    tmp_path: Path,
) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    original = "".join(f"line {i}\n" for i in range(1, 31))
    (tree / "f.txt").write_text(original)
    patch = tmp_path / "0001-two-hunks.patch"
    patch.write_text(
        "--- a/f.txt\n+++ b/f.txt\n"
        "@@ -2,3 +2,3 @@\n line 2\n-line 3\n+line three\n line 4\n"
        "@@ -20,3 +20,3 @@\n line 20\n-line 99\n+line twenty-one\n line 22\n"
    )
    with pytest.raises(series.PatchError, match=r"0001-two-hunks.patch .*hunk #2 of f.txt"):
        series.apply_patch(tree, patch)
    assert (tree / "f.txt").read_text() == original  # the dry run caught it first


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    ident = ["-c", "user.name=t", "-c", "user.email=t@t"]
    proc = subprocess.run(["git", *ident, *args], cwd=repo, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.fixture
def committed(tmp_path: Path) -> tuple[Path, Path, str, str]:
    """A checkout (files and a symlink), its git dir, its commit and tree ids."""
    root = tmp_path / "checkout"
    (root / "src").mkdir(parents=True)
    (root / "src" / "a.c").write_text("int a;\n")
    (root / "README").write_bytes(b"bytes \x00 and \xff\n")
    (root / "link").symlink_to("src/a.c")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "one")
    commit = _git(root, "rev-parse", "HEAD")
    return root, root / ".git", commit, _git(root, "rev-parse", "HEAD^{tree}")


def test_a_tree_that_is_the_commit_passes(committed: tuple[Path, Path, str, str]) -> None:
    root, git_dir, commit, tree = committed
    assert tree_commit.verify(root, git_dir, commit, tree) == 3


def test_a_changed_missing_or_extra_file_is_named(committed: tuple[Path, Path, str, str]) -> None:
    root, git_dir, commit, tree = committed
    (root / "src" / "a.c").write_text("int a = 1;\n")
    (root / "README").unlink()
    (root / "extra.h").write_text("\n")
    with pytest.raises(tree_commit.TreeCommitError) as err:
        tree_commit.verify(root, git_dir, commit, tree)
    message = str(err.value)
    assert "3 file(s)" in message and "src/a.c: blob" in message
    assert "README: missing from the archive" in message and "extra.h: not in commit" in message


def test_a_commit_with_another_tree_is_refused(committed: tuple[Path, Path, str, str]) -> None:
    root, git_dir, commit, _tree = committed
    with pytest.raises(tree_commit.TreeCommitError, match=r"the lock records 0{40}"):
        tree_commit.verify(root, git_dir, commit, "0" * 40)


def test_the_pinned_archive_holds_the_locks_commit_and_the_series_applies(
    tmp_path: Path,
) -> None:
    """The real check, on a fresh tree of the pinned source (fetched if not cached)."""
    tree = fetch.pristine_tree(fetch.read_lock(), tmp_path / "llama.cpp")
    assert not (tree / ".git").exists(), "the submodule's gitlink is left out"
    applied = series.apply_series(tree)
    assert applied == [p.name for p in series.read_series()]
    assert "[SwarmKV patch]" in (tree / "include" / "llama.h").read_text()
