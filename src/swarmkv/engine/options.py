"""The validation of what a branch asks for, shared by every way to submit one (Pipeline.branch,
TOML files, Swarm.submit), and the reading of document text. Pure: no native code.
"""

from __future__ import annotations

from pathlib import Path

from ..checks import check_int, check_name, check_utf8
from ..errors import ConfigError
from ..llama.sampling import SamplerConfig


def check_branch(
    name: object,
    prompt: object,
    n_predict: object,
    sampler: SamplerConfig,
    stop: tuple[object, ...],
) -> None:
    """ConfigError naming the branch and the first bad option: a name that does not print as
    itself, a prompt that is not a non-blank UTF-8 string, n_predict not an integer >= 1, an
    empty or non-string stop string, or a bad sampler setting (SamplerConfig.validate)."""
    label = check_name("branch name", name)
    if not isinstance(prompt, str):
        raise ConfigError(f"branch {label!r}: the prompt must be a string, got {prompt!r}")
    if not prompt.strip():
        raise ConfigError(f"branch {label!r}: the prompt is empty")
    check_utf8(f"branch {label!r}: prompt", prompt)
    check_int(f"branch {label!r}: n_predict", n_predict, lo=1)
    for s in stop:
        if not isinstance(s, str):
            raise ConfigError(f"branch {label!r}: stop strings must be strings, got {s!r}")
        if not s:
            raise ConfigError(f"branch {label!r}: stop strings must not be empty")
        check_utf8(f"branch {label!r}: stop string", s)
    try:
        sampler.validate()
    except ConfigError as exc:
        raise ConfigError(f"branch {label!r}: {exc}") from None


def check_priority(name: str, priority: object) -> int:
    """A branch's scheduling priority: an integer (a string or None would make every later
    scheduling step fail, not just this branch's)."""
    return check_int(f"branch {name!r}: priority", priority)


def check_document_text(name: str, text: object) -> str:
    """A document's text: a non-blank UTF-8 string."""
    if not isinstance(text, str):
        raise ConfigError(f"document {name!r}: text must be a string, got {type(text).__name__}")
    if not text.strip():
        raise ConfigError(f"document {name!r}: the document is empty")
    check_utf8(f"document {name!r}", text)
    return text


def read_stdin_document(name: str) -> str:
    """The document piped on standard input (`--doc -`), as UTF-8 text."""
    import sys

    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"prefill {name!r}: standard input is not UTF-8 text (byte {exc.start}: {exc.reason})"
        ) from exc


def read_document(name: str, p: Path) -> str:
    """A document file's text (UTF-8); ConfigError naming the file and what is wrong."""
    if p.is_dir():
        raise ConfigError(f"prefill {name!r}: document path is a directory: {p}")
    if not p.is_file():
        raise ConfigError(f"prefill {name!r}: document file not found: {p}")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"prefill {name!r}: document {p} is not UTF-8 text (byte {exc.start}: {exc.reason})"
        ) from exc
    except OSError as exc:
        raise ConfigError(f"prefill {name!r}: cannot read document {p}: {exc.strerror}") from exc
