#!/usr/bin/env python3
"""Verify that an extracted llama.cpp tree is exactly the commit vendor/llama.cpp.lock names.

The pinned source distribution carries the llama.cpp submodule's own git data (a shallow
clone: the commit object, its tree and every blob). The lock's `commit` is checked there:
  1. the commit object's bytes hash to the commit id (git's object naming), so the object is
     the commit and not a look-alike;
  2. its tree is the lock's `tree`;
  3. every file extracted from the archive hashes (as a git blob) to the blob that tree names
     at its path, and no path is missing or extra.
So the recorded commit is verified against the files that are built, not just claimed.

Needs the `git` command to read the packed objects; without it verify() raises
TreeCommitError saying so, and fetch_llama_cpp.py reports the check as not done.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

# A top-level ".git" (a submodule's gitlink file, or a repository) is git's bookkeeping,
# not a file of the commit.
GIT_ENTRY = ".git"


class TreeCommitError(RuntimeError):
    pass


def git_blob_id(data: bytes) -> str:
    """The id git gives a blob of these bytes: sha1 of "blob <size>\\0" + data."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _git(git_dir: Path, *args: str) -> bytes:
    if shutil.which("git") is None:
        raise TreeCommitError("the git command is not installed, so the commit cannot be read")
    proc = subprocess.run(
        ["git", f"--git-dir={git_dir}", *args],
        capture_output=True,
        # the archived config names a work tree that does not exist here (git would chdir to
        # it and fail): any existing folder will do, nothing is read from it
        env={
            **os.environ,
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_WORK_TREE": str(git_dir),
        },
    )
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip()
        raise TreeCommitError(f"git {' '.join(args)} failed in {git_dir}: {err}")
    return proc.stdout


def commit_tree(git_dir: Path, commit: str) -> str:
    """The tree id of commit, after checking that the commit object's bytes hash to its id."""
    raw = _git(git_dir, "cat-file", "commit", commit)
    actual = hashlib.sha1(b"commit %d\0" % len(raw) + raw, usedforsecurity=False).hexdigest()
    if actual != commit:
        raise TreeCommitError(f"the object named {commit} hashes to {actual}")
    first = raw.split(b"\n", 1)[0].decode()
    if not first.startswith("tree "):
        raise TreeCommitError(f"commit {commit} has no tree line (first line: {first!r})")
    return first.removeprefix("tree ")


def tree_blobs(git_dir: Path, tree: str) -> dict[str, str]:
    """path -> blob id for every file under tree (symlinks included, submodules left out)."""
    out: dict[str, str] = {}
    for line in _git(git_dir, "ls-tree", "-r", "-z", tree).split(b"\0"):
        if not line:
            continue
        meta, path = line.split(b"\t", 1)
        _mode, kind, oid = meta.decode().split()
        if kind == "blob":
            out[path.decode()] = oid
    return out


def file_blobs(root: Path) -> dict[str, str]:
    """path -> git blob id for every file under root, as git would hash a checkout of it."""
    out: dict[str, str] = {}
    for path in root.rglob("*"):
        rel = path.relative_to(root).as_posix()
        if rel.split("/", 1)[0] == GIT_ENTRY:
            continue
        if path.is_symlink():
            out[rel] = git_blob_id(os.readlink(path).encode())
        elif path.is_file():
            out[rel] = git_blob_id(path.read_bytes())
    return out


def verify(root: Path, git_dir: Path, commit: str, tree: str) -> int:
    """Check root against commit (see the module docstring); returns the files checked."""
    got_tree = commit_tree(git_dir, commit)
    if got_tree != tree:
        raise TreeCommitError(f"commit {commit} has tree {got_tree}, the lock records {tree}")
    want, have = tree_blobs(git_dir, tree), file_blobs(root)
    problems = [f"{p}: missing from the archive" for p in sorted(want.keys() - have.keys())]
    problems += [f"{p}: not in commit {commit[:12]}" for p in sorted(have.keys() - want.keys())]
    problems += [
        f"{p}: blob {have[p][:12]} here, {want[p][:12]} in commit {commit[:12]}"
        for p in sorted(want.keys() & have.keys())
        if want[p] != have[p]
    ]
    if problems:
        shown = "\n  ".join(problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise TreeCommitError(
            f"{len(problems)} file(s) of {root} differ from llama.cpp commit {commit}:\n"
            f"  {shown}{more}"
        )
    return len(want)


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print("usage: tree_commit.py TREE GIT_DIR COMMIT TREE_ID", file=sys.stderr)
        return 2
    try:
        n = verify(Path(argv[0]), Path(argv[1]), argv[2], argv[3])
    except TreeCommitError as exc:
        print(f"tree_commit: error: {exc}", file=sys.stderr)
        return 1
    print(f"{n} files equal commit {argv[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
