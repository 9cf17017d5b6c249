"""Which SwarmKV source a benchmark ran: the git commit of the checkout it was installed from.

An editable install imports swarmkv from the checkout itself; a plain `pip install .` copies it
into site-packages, so the checkout is looked for where the bench was started too (the quick
start runs it from the clone). Uncommitted changes are said, never hidden."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

import swarmkv


def _git(repo: Path, *args: str) -> str | None:
    """git's stdout in repo, stripped; None when git is missing or the command fails."""
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _swarmkv_checkout(start: Path) -> Path | None:
    """The top of the git work tree holding start, if that tree is SwarmKV's source."""
    top = _git(start, "rev-parse", "--show-toplevel")
    if top is None or not (Path(top) / "swarmkv" / "__init__.py").is_file():
        return None
    return Path(top)


def swarmkv_commit(starts: Sequence[Path] | None = None) -> str:
    """`<commit>` of the first SwarmKV checkout found from starts (default: the imported
    package's folder, then the working directory), with "(+ uncommitted changes)" when
    tracked files differ from it and "checkout at <path>; the package ran from an installed
    copy" when only a later start found it; otherwise the installed version and why no
    commit."""
    package_dir = Path(swarmkv.__file__).resolve().parent
    starts = [package_dir, Path.cwd()] if starts is None else list(starts)
    for i, start in enumerate(starts):
        top = _swarmkv_checkout(start)
        commit = _git(top, "rev-parse", "HEAD") if top is not None else None
        if top is None or commit is None:
            continue
        notes = []
        if _git(top, "status", "--porcelain", "--untracked-files=no"):
            notes.append("+ uncommitted changes")
        if i > 0:
            notes.append(f"checkout at {top}; the package ran from an installed copy")
        return commit + (f" ({'; '.join(notes)})" if notes else "")
    return f"none found (swarmkv {swarmkv.__version__} installed, no git checkout beside it)"
