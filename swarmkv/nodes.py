"""The two kinds of pipeline node: PrefillNode (the shared document) and BranchNode.

Both are plain specs validated before anything native runs; the handoff modes in handoff.py
turn them into DAG work. The text a branch sees is the document followed by its prompt,
tokenized separately: the document with BOS, the prompt without. For that to equal
tokenizing `document + prompt` as one string, end the document at a token boundary (a
newline or sentence end) and start the prompt with a space or newline (see README).
"""

from __future__ import annotations

import string
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import ConfigError
from .sampling import SamplerConfig, TokenCallback

if TYPE_CHECKING:  # nodes are pure specs: the model is only passed in to tokenize
    from .model import Model
    from .prefix_source import SnapshotSource


@dataclass(frozen=True)
class PrefillNode:
    """The shared document, decoded once on the prefix sequence.

    With a snapshot (SnapshotSource) the document is the snapshot's tokens, or, when text is
    given too, that text: its leading tokens are restored from the snapshot if they match
    and only the rest is prefilled.
    """

    name: str
    text: str | None
    snapshot: SnapshotSource | None = None

    @staticmethod
    def from_source(
        name: str,
        text: str | None = None,
        path: str | Path | None = None,
        snapshot: SnapshotSource | None = None,
    ) -> PrefillNode:
        """A PrefillNode from one of text= or path= (read as UTF-8), optionally a snapshot.

        Raises ConfigError for both text and path, for neither without a snapshot, a missing
        or unreadable file, or an empty (whitespace) text.
        """
        if text is not None and path is not None:
            raise ConfigError(f"prefill {name!r}: give text= or path=, not both")
        if text is None and path is None and snapshot is None:
            raise ConfigError(f"prefill {name!r}: give one of text=, path= or snapshot=")
        if path is not None:
            text = read_document(name, Path(path))
        if text is not None and not text.strip():
            raise ConfigError(f"prefill {name!r}: the document is empty")
        return PrefillNode(name, text, snapshot)

    def tokenize(self, model: Model) -> list[int]:
        """Token ids of the document, with the special tokens (BOS) the model asks for."""
        if self.text is None:
            assert self.snapshot is not None
            return list(self.snapshot.tokens)
        return model.tokenize(self.text, add_special=True)


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


@dataclass(frozen=True)
class BranchNode:
    """One agent reading the document: a prompt, a token budget and sampler settings.

    `after` names the prefill node and optionally other branches; an upstream branch's text
    can be used in the prompt as `{name}`. `required_prefix_tokens=W` lets the branch start
    as soon as the first W document tokens are decoded (it then sees only those).
    """

    name: str
    prompt: str
    after: tuple[str, ...]
    n_predict: int = 64
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    stop: tuple[str, ...] = ()
    required_prefix_tokens: int | None = None
    on_token: TokenCallback | None = field(default=None, compare=False, repr=False)

    @staticmethod
    def from_options(
        name: str,
        *,
        prompt: str,
        after: str | Iterable[str] | None = None,
        n_predict: int = 64,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        min_p: float | None = None,
        seed: int = 0,
        stop: Iterable[str] = (),
        required_prefix_tokens: int | None = None,
        on_token: TokenCallback | None = None,
    ) -> BranchNode:
        """A BranchNode from Pipeline.branch()'s keyword options (not yet validated).

        after may be one name or several; the sampler fields become a SamplerConfig.
        """
        deps = (after,) if isinstance(after, str) else tuple(after or ())
        sampler = SamplerConfig(temperature, top_k, top_p, min_p, seed)
        return BranchNode(
            name, prompt, deps, n_predict, sampler, tuple(stop), required_prefix_tokens, on_token
        )

    def validate(self) -> None:
        """Check the spec in pure Python; raises ConfigError naming the first bad field.

        Checked: a non-blank prompt, n_predict >= 1, required_prefix_tokens >= 1, no empty
        stop string, and the sampler settings (SamplerConfig.validate).
        """
        if not self.prompt.strip():
            raise ConfigError(f"branch {self.name!r}: the prompt is empty")
        if self.n_predict < 1:
            raise ConfigError(f"branch {self.name!r}: n_predict must be >= 1, got {self.n_predict}")
        if self.required_prefix_tokens is not None and self.required_prefix_tokens < 1:
            raise ConfigError(f"branch {self.name!r}: required_prefix_tokens must be >= 1")
        if any(not s for s in self.stop):
            raise ConfigError(f"branch {self.name!r}: stop strings must not be empty")
        self.sampler.validate()

    def placeholders(self) -> list[str]:
        """Names of upstream branches the prompt interpolates as {name}."""
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(self.prompt) if f is not None]
        except ValueError as exc:
            raise ConfigError(f"branch {self.name!r}: bad prompt template: {exc}") from exc
        return fields

    def render(self, upstream_text: dict[str, str]) -> str:
        """The prompt with each {name} replaced by that upstream branch's text."""
        if not self.placeholders():
            return self.prompt
        return self.prompt.format(**upstream_text)

    def prompt_tokens(self, model: Model, upstream_text: dict[str, str]) -> list[int]:
        """Token ids of the rendered prompt, without BOS (it continues the document)."""
        return model.tokenize(self.render(upstream_text), add_special=False)

    def estimated_prompt_tokens(self, model: Model, n_predict_of: dict[str, int]) -> int:
        """Upper estimate before upstream text exists: its n_predict tokens plus slack each."""
        names = self.placeholders()
        base = model.tokenize(self.render({n: "" for n in names}), add_special=False)
        return len(base) + sum(n_predict_of[n] + 4 for n in names)
