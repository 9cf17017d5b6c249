"""The two kinds of pipeline node: PrefillNode (the shared document) and BranchNode.

Both are plain specs validated before anything native runs; the handoff modes in handoff.py
turn them into DAG work. The text a branch sees is the document followed by its prompt,
tokenized separately: the document with BOS, the prompt without. For that to equal
tokenizing `document + prompt` as one string, end the document at a token boundary (a
newline or sentence end) and start the prompt with a space or newline (docs/guide/prompts.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..checks import check_int, check_name, check_utf8
from ..engine.options import check_branch, read_document
from ..errors import ConfigError
from ..llama.constraint import Constraint
from ..llama.sampling import SamplerConfig, TokenCallback

if TYPE_CHECKING:  # nodes are pure specs: the model is only passed in to tokenize
    from ..kv.prefix_source import SnapshotSource
    from ..llama.model import Model


# `{{name}}` (group 1) or `{name}` (group 2); a name holds no braces (JSON keeps its own)
_BRACED = re.compile(r"\{\{([^{}]*)\}\}|\{([^{}]*)\}")
_IDENT = re.compile(r"[A-Za-z_][\w.\-]*")


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
        check_name("document name", name)
        if text is not None and path is not None:
            raise ConfigError(f"prefill {name!r}: give text= or path=, not both")
        if text is None and path is None and snapshot is None:
            raise ConfigError(f"prefill {name!r}: give one of text=, path= or snapshot=")
        if path is not None:
            text = read_document(name, Path(path))
        if text is not None and not text.strip():
            raise ConfigError(f"prefill {name!r}: the document is empty")
        if text is not None:
            check_utf8(f"prefill {name!r}: the document", text)
        return PrefillNode(name, text, snapshot)

    def tokenize(self, model: Model) -> list[int]:
        """Token ids of the document, with the special tokens (BOS) the model asks for."""
        if self.text is None:
            assert self.snapshot is not None
            return list(self.snapshot.tokens)
        return model.tokenize(self.text, add_special=True)


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
        constraint: Constraint | None = None,
    ) -> BranchNode:
        """A BranchNode from Pipeline.branch()'s keyword options (not yet validated).

        after may be one name or several; the sampler fields and the constraint become a
        SamplerConfig.
        """
        deps = (after,) if isinstance(after, str) else tuple(after or ())
        sampler = SamplerConfig(temperature, top_k, top_p, min_p, seed, constraint)
        return BranchNode(
            name, prompt, deps, n_predict, sampler, tuple(stop), required_prefix_tokens, on_token
        )

    def validate(self) -> None:
        """Check the spec in pure Python; raises ConfigError naming the first bad field
        (engine.options.check_branch, and required_prefix_tokens an integer >= 1)."""
        check_branch(self.name, self.prompt, self.n_predict, self.sampler, self.stop)
        if self.required_prefix_tokens is not None:
            check_int(
                f"branch {self.name!r}: required_prefix_tokens", self.required_prefix_tokens, lo=1
            )

    def placeholders(self) -> list[str]:
        """Names of upstream branches the prompt interpolates: each `{name}` whose name is
        listed in after. Every other brace is literal text (see render)."""
        ups = set(self.after)
        return [m[2] for m in _BRACED.finditer(self.prompt) if m[2] is not None and m[2] in ups]

    def stray_fields(self) -> list[str]:
        """`{word}` in the prompt naming nothing in after: kept literally, maybe a typo."""
        ups = set(self.after)
        return [
            m[2]
            for m in _BRACED.finditer(self.prompt)
            if m[2] is not None and m[2] not in ups and _IDENT.fullmatch(m[2])
        ]

    def render(self, upstream_text: dict[str, str]) -> str:
        """The prompt with each `{name}` of an upstream branch replaced by its text and each
        `{{name}}` written as `{name}` (name: an upstream branch's, or any word of letters,
        digits, `_`, `.` and `-`: the escape works whether or not the word names a branch);
        any other brace is kept as written, so JSON or code in a prompt needs no escaping."""

        def sub(m: re.Match[str]) -> str:
            escaped, name = m[1], m[2]
            if escaped is not None and (escaped in upstream_text or _IDENT.fullmatch(escaped)):
                return "{" + escaped + "}"
            if name is not None and name in upstream_text:
                return upstream_text[name]
            return m[0]

        return _BRACED.sub(sub, self.prompt)

    def prompt_tokens(self, model: Model, upstream_text: dict[str, str]) -> list[int]:
        """Token ids of the rendered prompt, without BOS (it continues the document)."""
        return model.tokenize(self.render(upstream_text), add_special=False)

    def estimated_prompt_tokens(self, model: Model, n_predict_of: dict[str, int]) -> int:
        """Upper estimate before upstream text exists: its n_predict tokens plus slack each."""
        names = [n for n in self.placeholders() if n in n_predict_of]  # branches, not the doc
        base = model.tokenize(self.render(dict.fromkeys(names, "")), add_special=False)
        return len(base) + sum(n_predict_of[n] + 4 for n in names)
