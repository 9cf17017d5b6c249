#!/usr/bin/env python3
"""SwarmKV's changes to llama.cpp: a series of patches in vendor/patches/, in the order that
vendor/patches/series names.

Each patch is a `git format-patch` mail: its message says what it changes, why, its switch,
its tests and whether it could go upstream. Commands (run from anywhere):

  python vendor/patch_series.py check          apply the series to a fresh tree of the pinned
                                               commit (verified, see tree_commit.py); a patch
                                               that does not apply is named with its hunk
  python vendor/patch_series.py worktree DIR   a git repository at DIR: the pinned tree as the
                                               first commit, then one commit per patch (git am)
  python vendor/patch_series.py export DIR     DIR's commits after the first, back into
                                               vendor/patches/ and the series file

To change a patch: `worktree`, edit and commit (`git commit --amend` or `git rebase -i`) in
DIR, then `export`, then `check`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

VENDOR = Path(__file__).resolve().parent
PATCHES = VENDOR / "patches"
SERIES = PATCHES / "series"

# A fixed identity and date for the exported mails, so that exporting twice gives the same
# bytes and a diff of the series shows only what changed.
GIT_ENV = {
    "GIT_AUTHOR_NAME": "SwarmKV",
    "GIT_AUTHOR_EMAIL": "swarmkv@users.noreply.github.com",
    "GIT_COMMITTER_NAME": "SwarmKV",
    "GIT_COMMITTER_EMAIL": "swarmkv@users.noreply.github.com",
    "GIT_AUTHOR_DATE": "2026-12-01T00:00:00+00:00",
    "GIT_COMMITTER_DATE": "2026-12-01T00:00:00+00:00",
}


class PatchError(RuntimeError):
    pass


def read_series(folder: Path = PATCHES) -> list[Path]:
    """The patches in the order the series file names them; every patch in the folder must be
    named there exactly once, and every name must be a file."""
    series = folder / "series"
    if not series.is_file():
        raise PatchError(f"{series} is missing: it names the patches in the order they apply")
    names = [ln.strip() for ln in series.read_text().splitlines() if ln.strip() and ln[0] != "#"]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise PatchError(f"{series} names {', '.join(dupes)} more than once")
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise PatchError(f"{series} names {', '.join(missing)}, which is not in {folder}")
    unlisted = sorted(p.name for p in folder.glob("*.patch") if p.name not in names)
    if unlisted:
        raise PatchError(f"{', '.join(unlisted)} in {folder} is not named in {series}")
    return [folder / n for n in names]


def _failed_hunks(output: str) -> list[str]:
    """'hunk #N of FILE (at line L)' for every hunk `patch` reports as failed."""
    failed, current = [], "?"
    for line in output.splitlines():
        m = re.match(r"(?:patching|checking) file (.+)", line)
        if m:
            current = m.group(1).strip().strip("'")
            continue
        m = re.match(r"Hunk #(\d+) FAILED at (\d+)", line)
        if m:
            failed.append(f"hunk #{m.group(1)} of {current} (at line {m.group(2)})")
    return failed


def apply_patch(tree: Path, patch: Path) -> None:
    """Apply one patch to tree, or raise PatchError naming the patch and each failed hunk.

    A dry run first: a patch that fails leaves the tree as it was."""
    for dry in (True, False):
        cmd = ["patch", "-p1", "--forward", "--batch", "--no-backup-if-mismatch", "-i"]
        proc = subprocess.run(
            [*cmd, str(patch), *(["--dry-run"] if dry else [])],
            cwd=tree,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            output = proc.stdout + proc.stderr
            hunks = _failed_hunks(output)
            where = "; ".join(hunks) if hunks else output.strip().splitlines()[-1:]
            raise PatchError(f"patch {patch.name} does not apply: {where}\n{output.strip()}")


def apply_series(tree: Path, patches: list[Path] | None = None) -> list[str]:
    """Apply the series (or the given patches) in order; returns the names applied."""
    patches = read_series() if patches is None else patches
    for patch in patches:
        apply_patch(tree, patch)
    return [p.name for p in patches]


def _pristine(dest: Path) -> Path:
    """A fresh, verified tree of the pinned commit at dest (no patches)."""
    sys.path.insert(0, str(VENDOR))
    import fetch_llama_cpp as fetch

    return fetch.pristine_tree(fetch.read_lock(), dest)


def check() -> int:
    with tempfile.TemporaryDirectory(prefix="swarmkv-series.") as tmp:
        tree = _pristine(Path(tmp) / "llama.cpp")
        names = apply_series(tree)
    print(f"series applies to a fresh tree of the pinned commit: {', '.join(names)}")
    return 0


def _run(cmd: list[str], cwd: Path) -> str:
    env = {**os.environ, **GIT_ENV}
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise PatchError(f"{' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def worktree(dest: Path) -> int:
    if dest.exists():
        raise PatchError(f"{dest} exists; give a new folder")
    _pristine(dest)
    _run(["git", "init", "-q"], dest)
    _run(["git", "add", "-A", "-f"], dest)
    _run(["git", "commit", "-q", "-m", "llama.cpp as pinned in vendor/llama.cpp.lock"], dest)
    _run(["git", "tag", "pinned"], dest)
    for patch in read_series():
        _run(["git", "am", "-q", "--keep-cr", str(patch)], dest)
    print(f"{dest}: the pinned tree (tag 'pinned') and one commit per patch")
    return 0


def export(repo: Path) -> int:
    out = Path(tempfile.mkdtemp(prefix="swarmkv-export."))
    try:
        args = ["git", "format-patch", "-q", "--zero-commit", "--no-signature"]
        _run([*args, "--numbered", "-o", str(out), "pinned..HEAD"], repo)
        made = sorted(out.glob("*.patch"))
        for old in PATCHES.glob("*.patch"):
            old.unlink()
        for patch in made:
            shutil.copy2(patch, PATCHES / patch.name)
        header = "# The order in which vendor/patches/ apply (vendor/patch_series.py).\n"
        SERIES.write_text(header + "".join(f"{p.name}\n" for p in made))
    finally:
        shutil.rmtree(out, ignore_errors=True)
    print(f"exported {len(made)} patches to {PATCHES}")
    return 0


def main(argv: list[str]) -> int:
    try:
        if argv == ["check"]:
            return check()
        if len(argv) == 2 and argv[0] == "worktree":
            return worktree(Path(argv[1]).resolve())
        if len(argv) == 2 and argv[0] == "export":
            return export(Path(argv[1]).resolve())
    except PatchError as exc:
        print(f"patch_series: error: {exc}", file=sys.stderr)
        return 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
