"""Pipelines described in TOML: load and validate a spec (pure Python), then build a Pipeline.

    [settings]                  # all optional; `swarmkv run` flags override these
    mode = "host"               # host | fork | device | baseline (default fork)
    model = "model.gguf"        # relative to this file's folder (default: the default model)
    ctx_size = 4096             # default: sized from the document and branches
    threads = 2
    n_batch = 512
    n_predict = 64              # defaults for every branch that does not set its own
    temperature = 0.0
    seed = 0
    exact = true                # batch-invariant decoding (default; see Pipeline)
    regex = "[0-9]+"            # an output constraint for every branch without its own
                                # (swarmkv.pipeline.toml_constraint: json_schema, regex, ...)

    [document]
    name = "doc"                # optional, default "doc"
    path = "doc.txt"            # relative to this file's folder; or text = "..." (one of them)
    snapshot = "doc.swkv"       # optional: start from a snapshot (`swarmkv snapshot create`);
                                # alone, the document is the snapshot's; with path or text,
                                # its leading tokens are reused when the document starts so

    [[branch]]
    name = "summary"
    prompt = "\\nSummary:"
    n_predict = 64              # optional; every key below is optional
    after = ["doc"]             # the document and/or other branches; prompt may use {name}
    required_prefix_tokens = 512   # watermark: start once this many doc tokens are decoded
    temperature = 0.0
    top_k = 40
    top_p = 0.95
    min_p = 0.05
    seed = 0
    stop = ["\\n\\n"]
    json_schema = { type = "object", properties = { n = { type = "integer" } } }
                                # or json_schema_file, json_object, regex, choice, grammar
                                # (grammar_file), gbnf (gbnf_file): one, validated here

A branch's own value wins over [settings] (and over the command line). Everything, the
document file included, is checked by load_pipeline_spec without loading a model, so a typo
fails in milliseconds instead of after the model load.
"""

from __future__ import annotations

import difflib
import math
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..checks import check_int
from ..errors import ConfigError
from ..kv.file import read_file_header
from ..llama.budget import GGML_MAX_N_THREADS
from ..llama.config import INT32_MAX
from ..llama.constraint import Constraint
from .modes import MODES
from .nodes import BranchNode, PrefillNode
from .spec import DEFAULT_MODE, PipelineSpec, check_sequences
from .toml_constraint import KEYS as CONSTRAINT_KEYS
from .toml_constraint import pop_constraint

if TYPE_CHECKING:
    from ..llama.model import Model
    from .builder import Pipeline

__all__ = [
    "BranchSpec",
    "DocumentSpec",
    "PipelineFile",
    "Settings",
    "build_pipeline",
    "check_spec",
    "load_pipeline_spec",
    "parse_pipeline_spec",
]

DEFAULT_N_PREDICT = 64


# -- the spec -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    """Pipeline-wide settings; None means "not given here" so layers can be merged."""

    mode: str | None = None
    model: Path | None = None
    ctx_size: int | None = None
    threads: int | None = None
    n_batch: int | None = None
    n_predict: int | None = None
    temperature: float | None = None
    seed: int | None = None
    exact: bool | None = None
    constraint: Constraint | None = None  # every branch's that sets none

    def merged(self, over: Settings) -> Settings:
        """These settings with every value `over` gives replacing ours."""
        given = {f.name: getattr(over, f.name) for f in fields(over)}
        return replace(self, **{k: v for k, v in given.items() if v is not None})


@dataclass(frozen=True)
class DocumentSpec:
    """The [document] table: a name and either inline text or a file path."""

    name: str = "doc"
    text: str | None = None
    path: Path | None = None
    snapshot: Path | None = None

    def node(self) -> PrefillNode:
        """The validated prefill node; a file that cannot be read is a ConfigError too.

        A snapshot's header is read and checked here (format, checksum: pure Python); the
        node's text is None when the snapshot alone is the document."""
        if self.snapshot is not None:
            read_file_header(self.snapshot)
            if self.text is None and self.path is None:
                return PrefillNode(self.name, None)
        try:
            return PrefillNode.from_source(self.name, text=self.text, path=self.path)
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"document {self.name!r}: cannot read {self.path}: {exc}") from exc


@dataclass(frozen=True)
class BranchSpec:
    """One [[branch]] table: name, prompt, dependencies, stop strings and sampling values.

    n_predict, temperature and seed left None fall back to [settings], then the defaults.
    """

    name: str
    prompt: str
    after: tuple[str, ...] = ()
    n_predict: int | None = None
    required_prefix_tokens: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    constraint: Constraint | None = None


@dataclass(frozen=True)
class PipelineFile:
    """A pipeline as a TOML file gives it: the document, branches, settings, the file read."""

    document: DocumentSpec
    branches: tuple[BranchSpec, ...]
    settings: Settings = Settings()
    source: Path | None = None  # the TOML file, for messages

    @property
    def mode(self) -> str:
        """The handoff mode: settings.mode, else the default (fork)."""
        return self.settings.mode or DEFAULT_MODE

    def with_settings(self, over: Settings) -> PipelineFile:
        """A copy whose settings take every value `over` gives."""
        return replace(self, settings=self.settings.merged(over))

    def branch_kwargs(self, b: BranchSpec) -> dict[str, Any]:
        """Pipeline.branch() keyword arguments: the branch's values, else [settings]'."""
        s = self.settings
        return {
            "prompt": b.prompt,
            "after": b.after or None,
            "n_predict": _first(b.n_predict, s.n_predict, DEFAULT_N_PREDICT),
            "temperature": _first(b.temperature, s.temperature, 0.0),
            "top_k": b.top_k,
            "top_p": b.top_p,
            "min_p": b.min_p,
            "seed": _first(b.seed, s.seed, 0),
            "stop": b.stop,
            "required_prefix_tokens": b.required_prefix_tokens,
            "constraint": b.constraint if b.constraint is not None else s.constraint,
        }

    def pipeline_spec(self) -> PipelineSpec:
        """The document and branches as the nodes Pipeline.run validates and runs."""
        nodes = tuple(
            BranchNode.from_options(b.name, **self.branch_kwargs(b)) for b in self.branches
        )
        return PipelineSpec(self.document.node(), nodes, self.mode, self.source)


def _first(*values: Any) -> Any:
    return next(v for v in values if v is not None)


# -- key and type checking ------------------------------------------------------------------
def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # TOML's true is not a count


def _is_float(v: object) -> bool:
    # TOML spells nan and inf as floats; no setting means anything by them (temperature nan
    # once sampled token 262143 every step), so they are refused here, where the file is named
    return _is_int(v) or (isinstance(v, float) and math.isfinite(v))


def _is_str_list(v: object) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


# key -> (check, description for the message)
_Kind = tuple[Callable[[object], bool], str]
_STR: _Kind = (lambda v: isinstance(v, str), "a string")
_INT: _Kind = (_is_int, "an integer")
_FLOAT: _Kind = (_is_float, "a finite number")
_BOOL: _Kind = (lambda v: isinstance(v, bool), "true or false")
_STRS: _Kind = (_is_str_list, "a list of strings")
_STR_OR_STRS: _Kind = (lambda v: isinstance(v, str) or _is_str_list(v), "a string or strings")
_TABLE: _Kind = (lambda v: isinstance(v, dict), "a table")
# the output-constraint keys, in [settings] and [[branch]] (toml_constraint)
_CONSTRAINT_KINDS: dict[str, _Kind] = {
    k: {"json_schema": _TABLE, "json_object": _BOOL, "choice": _STRS}.get(k, _STR)
    for k in CONSTRAINT_KEYS
}

_SETTINGS_KEYS: dict[str, _Kind] = {
    "mode": _STR,
    "model": _STR,
    "ctx_size": _INT,
    "threads": _INT,
    "n_batch": _INT,
    "n_predict": _INT,
    "temperature": _FLOAT,
    "seed": _INT,
    "exact": _BOOL,
    **_CONSTRAINT_KINDS,
}
_DOCUMENT_KEYS: dict[str, _Kind] = {
    "name": _STR,
    "path": _STR,
    "text": _STR,
    "snapshot": _STR,
}
_BRANCH_KEYS: dict[str, _Kind] = {
    "name": _STR,
    "prompt": _STR,
    "after": _STR_OR_STRS,
    "n_predict": _INT,
    "required_prefix_tokens": _INT,
    "temperature": _FLOAT,
    "top_k": _INT,
    "top_p": _FLOAT,
    "min_p": _FLOAT,
    "seed": _INT,
    "stop": _STRS,
    **_CONSTRAINT_KINDS,
}
_TOP_KEYS = ("settings", "document", "branch")


def _unknown(where: str, key: str, known: list[str] | tuple[str, ...]) -> ConfigError:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(known)}"
    return ConfigError(f"{where}: unknown key {key!r}{hint}")


def _checked(table: Mapping[str, Any], where: str, kinds: dict[str, _Kind]) -> dict[str, Any]:
    """The table's entries after checking every key is known and every value's type."""
    for key, value in table.items():
        if key not in kinds:
            raise _unknown(where, key, list(kinds))
        check, what = kinds[key]
        if not check(value):
            raise ConfigError(
                f"{where}: {key!r} must be {what}, got {type(value).__name__} {value!r}"
            )
    return dict(table)


def _table(data: Mapping[str, Any], key: str, label: str) -> Mapping[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{label}[{key}] must be a table, got {type(value).__name__}")
    return value


# -- sections -------------------------------------------------------------------------------
# The [settings] counts and their bounds: each ends in an int32_t of llama.cpp (n_ctx, n_batch,
# a branch's token count) or in ggml's threads (their limit is check_spec's, with its reason).
# The branches' own integers are bounded where they are used (BranchNode, SamplerConfig).
_SETTINGS_COUNTS: dict[str, int | None] = {
    "ctx_size": INT32_MAX,
    "threads": None,
    "n_batch": INT32_MAX,
    "n_predict": INT32_MAX,
}


def _check_counts(where: str, values: Mapping[str, Any], quote: bool) -> None:
    """ConfigError naming the first [settings] count that is not in [1, its bound]."""
    for key, hi in _SETTINGS_COUNTS.items():
        if values.get(key) is not None:
            check_int(f"{where}{key!r}" if quote else f"{where}{key}", values[key], lo=1, hi=hi)


def _settings(data: Mapping[str, Any], base_dir: Path, label: str) -> Settings:
    where = f"{label}[settings]"
    values = _checked(_table(data, "settings", label), where, _SETTINGS_KEYS)
    _check_counts(f"{where}: ", values, quote=True)
    if "mode" in values and values["mode"] not in MODES:
        raise ConfigError(
            f"{where}: mode must be one of {', '.join(MODES)}, got {values['mode']!r}"
        )
    if "model" in values:
        values["model"] = base_dir / Path(values["model"]).expanduser()
    if "temperature" in values:
        values["temperature"] = float(values["temperature"])
    values["constraint"] = pop_constraint(values, base_dir, where)
    return Settings(**values)


def _document(data: Mapping[str, Any], base_dir: Path, label: str) -> DocumentSpec:
    if "document" not in data:
        raise ConfigError(f"{label}no [document] table: give one with path = or text =")
    where = f"{label}[document]"
    values = _checked(_table(data, "document", label), where, _DOCUMENT_KEYS)
    if "path" in values and "text" in values:
        raise ConfigError(f"{where}: give one of 'path' or 'text', not both")
    if "path" not in values and "text" not in values and "snapshot" not in values:
        raise ConfigError(f"{where}: give one of 'path', 'text' or 'snapshot'")
    for key in ("path", "snapshot"):
        if key in values:
            values[key] = base_dir / Path(values[key]).expanduser()
    return DocumentSpec(**values)


def _branch(index: int, entry: object, base_dir: Path, label: str) -> BranchSpec:
    where = f"{label}branch[{index}]"
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: must be a table ([[branch]]), got {type(entry).__name__}")
    if isinstance(entry.get("name"), str):
        where += f" {entry['name']!r}"
    values = _checked(entry, where, _BRANCH_KEYS)
    for key in ("name", "prompt"):
        if key not in values:
            raise ConfigError(f"{where}: missing required key {key!r}")
    if isinstance(values.get("after"), str):
        values["after"] = [values["after"]]
    for key in ("after", "stop"):
        if key in values:
            values[key] = tuple(values[key])
    for key in ("temperature", "top_p", "min_p"):
        if key in values:
            values[key] = float(values[key])
    values["constraint"] = pop_constraint(values, base_dir, where)
    return BranchSpec(**values)


def _branches(data: Mapping[str, Any], base_dir: Path, label: str) -> tuple[BranchSpec, ...]:
    entries = data.get("branch", [])
    if not isinstance(entries, list):
        raise ConfigError(f"{label}'branch' must be an array of tables ([[branch]])")
    if not entries:
        raise ConfigError(f"{label}no [[branch]] entries: give at least one")
    # 1-based, as a person counts the [[branch]] blocks in the file
    return tuple(_branch(i, e, base_dir, label) for i, e in enumerate(entries, start=1))


# -- loading and validation -----------------------------------------------------------------
def parse_pipeline_spec(
    data: Mapping[str, Any], base_dir: str | Path = ".", source: Path | None = None
) -> PipelineFile:
    """A spec from already-parsed TOML; relative paths are taken from base_dir."""
    label = f"{source}: " if source is not None else ""
    for key in data:
        if key not in _TOP_KEYS:
            raise _unknown(f"{label}top level", key, _TOP_KEYS)
    base = Path(base_dir)
    spec = PipelineFile(
        document=_document(data, base, label),
        branches=_branches(data, base, label),
        settings=_settings(data, base, label),
        source=source,
    )
    check_spec(spec)
    return spec


def load_pipeline_spec(path: str | Path) -> PipelineFile:
    """Read and fully validate a pipeline TOML file; loads no model, does no native work."""
    p = Path(path).expanduser()
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read pipeline file {p}: {exc.strerror or exc}") from exc
    try:
        # utf-8-sig: a leading byte-order mark (as some editors save UTF-8) is dropped, where
        # tomllib would refuse it as an "Invalid statement"; one anywhere else stays an error
        data = tomllib.loads(raw.decode("utf-8-sig"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from exc
    return parse_pipeline_spec(data, p.resolve().parent, source=p)


def check_spec(spec: PipelineFile) -> None:
    """Everything Pipeline.run would reject before decoding, checked without a model.

    The file's own settings are checked here, the document and branches by the same
    PipelineSpec.validate() that Pipeline.run calls. Run again after merging command-line
    settings: they can change n_predict or the mode.
    """
    label = f"{spec.source}: " if spec.source is not None else ""
    # command-line values merged in are checked here, those of a file already by _settings
    _check_counts(label, {f.name: getattr(spec.settings, f.name) for f in fields(Settings)}, False)
    threads = spec.settings.threads
    if threads is not None and threads > GGML_MAX_N_THREADS:
        raise ConfigError(
            f"{label}threads must be at most {GGML_MAX_N_THREADS} (ggml's limit), got {threads}"
        )
    spec.pipeline_spec().validate()
    check_sequences(spec.mode, len(spec.branches), spec.settings.n_batch or 512)


# -- building -------------------------------------------------------------------------------
def build_pipeline(
    spec: PipelineFile, model_path_override: Model | str | Path | None = None
) -> Pipeline:
    """A Pipeline with the spec's document and branches; this loads the model.

    The spec is checked again first, so a spec built or merged in code fails before the load.
    model_path_override (a path or an open Model) wins over [settings] model.
    """
    from .builder import Pipeline  # the native-backed part, only when a pipeline is built

    check_spec(spec)
    s = spec.settings
    model = model_path_override if model_path_override is not None else s.model
    # n_batch and exact only when given, so Pipeline's own defaults apply otherwise
    given: dict[str, Any] = {
        k: v for k, v in (("n_batch", s.n_batch), ("exact", s.exact)) if v is not None
    }
    pipe = Pipeline(model, n_ctx=s.ctx_size, n_threads=s.threads, **given)
    try:
        doc = spec.document
        pipe.prefill(doc.name, text=doc.node().text, snapshot=doc.snapshot)
        for b in spec.branches:
            pipe.branch(b.name, **spec.branch_kwargs(b))
    except BaseException:
        pipe.close()  # the model was loaded for this pipeline; do not leak it
        raise
    return pipe
