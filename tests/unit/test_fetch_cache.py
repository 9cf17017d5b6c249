"""vendor/fetch_llama_cpp.py's cache logic with a cold cache (the download itself is faked)."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest
from vendor_scripts import load

fetch = load("fetch_llama_cpp")


def make_archive(path: Path, member: str) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        data = b"cmake_minimum_required(VERSION 3.14)\n"
        info = tarfile.TarInfo(f"{member}/CMakeLists.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def lock(tmp_path: Path) -> dict[str, str]:
    archive = make_archive(tmp_path / "pkg-1.0.tar.gz", "pkg-1.0/vendor/llama.cpp")
    return {
        "package": "pkg",
        "version": "1.0",
        "archive": archive.name,
        "sha256": hashlib.sha256(archive.read_bytes()).hexdigest(),
        "member": "pkg-1.0/vendor/llama.cpp",
        "source": str(archive),
    }


@pytest.fixture
def cold_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cold-cache"
    monkeypatch.setenv("SWARMKV_CACHE", str(cache))
    monkeypatch.delenv("SWARMKV_LLAMA_ARCHIVE", raising=False)
    return cache


def fake_pip(calls: list[Path]):  # type: ignore[no-untyped-def]
    def download(lock: dict[str, str], dest: Path) -> Path:
        calls.append(dest)
        target = dest / lock["archive"]
        target.write_bytes(Path(lock["source"]).read_bytes())
        return target

    return download


def test_cold_cache_downloads_once_then_reuses(
    lock: dict[str, str], cold_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert not cold_cache.exists()
    calls: list[Path] = []
    monkeypatch.setattr(fetch, "pip_download", fake_pip(calls))
    first = fetch.locate_archive(lock)
    assert calls == [cold_cache / "sdist"] and first == cold_cache / "sdist" / lock["archive"]
    second = fetch.locate_archive(lock)
    assert second == first and len(calls) == 1, "a warm cache must not download again"


def test_corrupt_cached_archive_is_downloaded_again(
    lock: dict[str, str], cold_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (cold_cache / "sdist").mkdir(parents=True)
    (cold_cache / "sdist" / lock["archive"]).write_bytes(b"truncated")
    calls: list[Path] = []
    monkeypatch.setattr(fetch, "pip_download", fake_pip(calls))
    path = fetch.locate_archive(lock)
    assert len(calls) == 1 and fetch.sha256_of(path) == lock["sha256"]


def test_offline_archive_bypasses_pip(
    lock: dict[str, str], cold_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWARMKV_LLAMA_ARCHIVE", lock["source"])
    monkeypatch.setattr(fetch, "pip_download", lambda *_: pytest.fail("pip must not run"))
    assert fetch.locate_archive(lock) == Path(lock["source"])


def test_missing_offline_archive_is_one_clear_error(
    cold_cache: Path, monkeypatch: pytest.MonkeyPatch, lock: dict[str, str]
) -> None:
    monkeypatch.setenv("SWARMKV_LLAMA_ARCHIVE", "/nonexistent/x.tar.gz")
    with pytest.raises(fetch.FetchError, match="SWARMKV_LLAMA_ARCHIVE=/nonexistent"):
        fetch.locate_archive(lock)


def test_without_pip_the_error_says_what_to_do(
    lock: dict[str, str], cold_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pip's isolated build environment had no pip: the failure that issue 7 reported.
    monkeypatch.setattr(fetch.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(fetch.FetchError, match=r"pip is not importable.*SWARMKV_LLAMA_ARCHIVE"):
        fetch.pip_download(lock, cold_cache)


def test_failed_download_prints_one_line_first(
    lock: dict[str, str], cold_cache: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    def fail(*_: object) -> Path:
        raise fetch.FetchError("could not download pkg==1.0 with pip (exit 1); ...")

    monkeypatch.setattr(fetch, "fetch", fail)
    assert fetch.main() == 1
    assert capsys.readouterr().err.startswith("fetch_llama_cpp: error: could not download")


def test_stamp_changes_when_a_patch_or_the_order_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "0001-x.patch").write_text("one\n")
    (patches / "0002-y.patch").write_text("y\n")
    (patches / "series").write_text("0001-x.patch\n0002-y.patch\n")
    monkeypatch.setattr(fetch, "PATCHES", patches)
    lock = {"package": "p", "version": "1", "sha256": "s", "commit": "c"}
    before = fetch.stamp_text(lock)
    (patches / "0001-x.patch").write_text("two\n")
    edited = fetch.stamp_text(lock)
    assert edited != before, "an edited patch must force a fresh tree"
    (patches / "series").write_text("0002-y.patch\n0001-x.patch\n")
    assert fetch.stamp_text(lock) != edited, "a reordered series must force a fresh tree"


def test_real_lock_pins_every_field() -> None:
    lock = fetch.read_lock()
    fields = {"package", "version", "archive", "sha256", "member", "commit", "git_dir", "tree"}
    assert fields <= set(lock)
    assert len(lock["sha256"]) == 64 and len(lock["commit"]) == 40
