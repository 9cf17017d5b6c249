"""Bad inputs across the CLI, TOML files, the Python API and files, with the error each gets.

The table of docs/reference/bad-input.md is generated from CASES below (docs/hooks/); run on
the default model, this module prints it with the full messages, so the table says what really
happens:

    python tests/native/bad_input_cases.py        # prints the Markdown table (a few minutes)

tests/native/test_bad_input_table.py runs every case on the tiny model and checks the kind
of error (exception class or exit status) and a model-independent part of its message.
CLI cases call `swarmkv.cli.app.main` in this process, in the work folder (so messages show
short paths), with standard input, output and error replaced.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DOC = "The lighthouse stood on the cliff for a century.\nIts last keeper left in 1987.\n"


@dataclass(frozen=True)
class Work:
    """The folder the cases read and write, and the model they load."""

    dir: Path
    model: Path


Outcome = tuple[str, str]  # ("exit 2" or an exception class name, the message)


@dataclass(frozen=True)
class Case:
    """One bad input: where it goes, what it is, the kind of error that must come back (an
    exception class name or `exit N`) and a part of its message."""

    where: str
    what: str
    run: Callable[[Work], Outcome]
    expect: str
    message: str


# -- runners -------------------------------------------------------------------------------
def cli(*args: str, stdin: bytes = b"", model: bool = True) -> Callable[[Work], Outcome]:
    """`swarmkv ARGS -m MODEL` (no -m when model=False): ("exit N", last stderr line)."""

    def run(w: Work) -> Outcome:
        argv = [*args, "-m", str(w.model)] if model else list(args)
        code, err = _main(argv, w.dir, stdin)
        lines = err.strip().splitlines() or [""]
        return f"exit {code}", lines[-1].replace(f"{w.dir}/", "")

    return run


def _main(argv: list[str], cwd: Path, stdin: bytes) -> tuple[int, str]:
    from swarmkv.cli.app import main

    err, here, old_stdin = io.StringIO(), os.getcwd(), sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
    os.chdir(cwd)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse's own errors
                code = int(exc.code or 0)
            except Exception as exc:  # what a user would see as a traceback
                return -1, f"Traceback: {type(exc).__name__}: {exc}"
    finally:
        os.chdir(here)
        sys.stdin = old_stdin
    return code, err.getvalue()


def api(fn: Callable[[Work], object]) -> Callable[[Work], Outcome]:
    """A Python call: (exception class name, message), or ("returned", repr) if none."""

    def run(w: Work) -> Outcome:
        try:
            value = fn(w)
        except Exception as exc:
            return type(exc).__name__, str(exc).replace(str(w.dir) + "/", "")
        return "returned", repr(value)

    return run


def toml(body: str, *args: str) -> Callable[[Work], Outcome]:
    """`swarmkv run p.toml` with a [document] of doc.txt and the given rest of the file."""

    def run(w: Work) -> Outcome:
        (w.dir / "p.toml").write_text('[document]\npath = "doc.txt"\n' + body)
        return cli("run", "p.toml", *args)(w)

    return run


def branches(*specs: str) -> str:
    """[[branch]] tables from "name: prompt [after=a,b]" lines, 2 tokens each."""
    out = []
    for spec in specs:
        name, _, rest = spec.partition(": ")
        prompt, _, after = rest.partition(" after=")
        out.append(f'[[branch]]\nname = "{name}"\nprompt = "{prompt}"\nn_predict = 2\n')
        if after:
            out.append("after = [" + ", ".join(f'"{a}"' for a in after.split(",")) + "]\n")
    return "".join(out)


# -- the Python API ---------------------------------------------------------------------------
def _batch_add(token: Any, pos: int, seq_id: int = 0) -> Callable[[Work], object]:
    def run(_w: Work) -> object:
        import swarmkv as sk

        with sk.Batch(8) as b:
            try:
                b.add(token, pos, (seq_id,))
            finally:
                assert b.add(1, 0, (0,)) == 0  # a refused row leaves the batch usable
        return None

    return run


def _context(**config: Any) -> Callable[[Work], object]:
    def run(w: Work) -> object:
        import swarmkv as sk

        with sk.Model(w.model) as m, sk.Context(m, **{"n_threads": 1, **config}):
            return None

    return run


def _decode_token(token: int) -> Callable[[Work], object]:
    def run(w: Work) -> object:
        import swarmkv as sk

        with sk.Model(w.model) as m, sk.Context(m, n_ctx=256, n_threads=1) as ctx, sk.Batch(8) as b:
            b.add(token, 0, (0,), True)
            ctx.decode(b)
        return None

    return run


def _close_model_under_a_context(w: Work) -> object:
    import swarmkv as sk

    m = sk.Model(w.model)
    ctx = sk.Context(m, n_ctx=256, n_threads=1)
    try:
        m.close()
    finally:
        ctx.close()
        m.close()
    return None


def _pipeline(branch: dict[str, Any] | None = None, **run: Any) -> Callable[[Work], object]:
    def go(w: Work) -> object:
        from swarmkv import Pipeline

        with Pipeline(w.model, n_threads=1) as p:
            p.prefill("doc", text=DOC)
            p.branch("b", **{"prompt": " Q", "n_predict": 2, **(branch or {})})
            return p.run(**run) if run else None

    return go


def _pool(case: str) -> Callable[[Work], object]:
    def run(_w: Work) -> object:
        import swarmkv as sk

        pool = sk.HostBufferPool()
        with pool:
            if case == "zero":
                return pool.alloc(0)
            buf = pool.alloc(16)
            if case == "released":
                buf.release()
                return buf.view
        return pool.alloc(16)  # closed

    return run


def _restore_other_settings(w: Work) -> object:
    import swarmkv as sk

    with sk.Model(w.model) as m, sk.HostBufferPool() as pool:
        tokens = m.tokenize(DOC)
        with sk.Context(m, n_ctx=256, n_threads=1) as a, sk.Batch(64) as b:
            b.add_sequence(tokens, 0, 0)
            a.decode(b)
            snap = sk.capture(a, 0, pool, tuple(tokens))
        with sk.Context(m, n_ctx=256, n_threads=1, type_k="f32") as other:
            return sk.restore(other, 0, snap)


def _snapshot_of_another_model(w: Work) -> object:
    from swarmkv import Pipeline

    with Pipeline(w.model, n_threads=1) as p:
        return p.prefill("doc", snapshot=_snapshot(w, other_model(w)))


# -- files --------------------------------------------------------------------------------------
def other_model(w: Work) -> Path:
    """A tiny model unlike w.model (another seed, so another fingerprint)."""
    path = w.dir / "other.gguf"
    if not path.exists():
        from support.tinymodel import make_tiny_model

        make_tiny_model(path, seed=1)
    return path


def _snapshot(w: Work, model: Path | None = None) -> Path:
    """A real snapshot of DOC made with model (w.model by default), saved once."""
    model = model or w.model
    path = w.dir / f"{model.stem}.swkv"
    if not path.exists():
        from swarmkv import Pipeline

        with Pipeline(model, n_threads=1) as p:
            p.prefill("doc", text=DOC)
            p.snapshot().save(path)
    return path


def _snapshot_variant(how: str) -> Callable[[Work], Path]:
    """A snapshot file made bad in one way, from a real one."""

    def make(w: Work) -> Path:
        from swarmkv.kv.file import encode, read_header

        good = _snapshot(w)
        data = good.read_bytes()
        path = w.dir / f"{how}.swkv"
        if how == "truncated":
            path.write_bytes(data[: len(data) // 2])
        elif how == "commit":
            with good.open("rb") as f:
                header, offset = read_header(f, good)
            other = dataclasses.replace(header, llama_cpp_commit="0" * 40)
            path.write_bytes(encode(other) + data[offset:])
        elif how == "claims":  # a consistent header (its checksum right) claiming 8 GiB
            with good.open("rb") as f:
                header, offset = read_header(f, good)
            path.write_bytes(encode(dataclasses.replace(header, nbytes=8 << 30)) + data[offset:])
        elif how == "bitflip":
            flipped = bytearray(data)
            flipped[-100] ^= 0x01
            path.write_bytes(bytes(flipped))
        return path

    return make


def snapshot_info(how: str) -> Callable[[Work], Outcome]:
    """`swarmkv snapshot info` on a snapshot file made bad in one way."""

    def run(w: Work) -> Outcome:
        path = _snapshot_variant(how)(w)
        return cli("snapshot", "info", path.name, model=False)(w)

    return run


def _load(make: Callable[[Work], Path]) -> Callable[[Work], object]:
    def run(w: Work) -> object:
        import swarmkv as sk

        with sk.HostBufferPool() as pool:
            return sk.KVSnapshot.load(make(w), pool)

    return run


def prepare(work: Work) -> None:
    """The files the cases read, in work.dir."""
    d = work.dir
    (d / "doc.txt").write_text(DOC)
    (d / "empty.txt").write_text("  \n")
    (d / "bin.dat").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00")
    (d / "folder").mkdir(exist_ok=True)
    with work.model.open("rb") as f:
        (d / "cut.gguf").write_bytes(f.read(1 << 16))
    (d / "notutf8.toml").write_bytes(b'[document]\ntext = "Doc \xff"\n')
    (d / "syntax.toml").write_text('[document\ntext = "Doc"\n')


# -- the cases ----------------------------------------------------------------------------------
def _cli_cases() -> list[Case]:
    run = ("run", "--doc", "doc.txt")
    q = ("--branch", " Q")
    many = [a for i in range(300) for a in ("--branch", f" Q{i}")]
    return [
        Case("CLI", "`--doc` a missing file", cli("run", "--doc", "no.txt", *q), "exit 2",
             "document file not found: no.txt"),
        Case("CLI", "`--doc` a directory", cli("run", "--doc", "folder", *q), "exit 2",
             "document path is a directory: folder"),
        Case("CLI", "`--doc` a binary file (not UTF-8)", cli("run", "--doc", "bin.dat", *q),
             "exit 2", "document bin.dat is not UTF-8 text (byte 0: invalid start byte)"),
        Case("CLI", "`--doc` a blank file", cli("run", "--doc", "empty.txt", *q), "exit 2",
             "the document is empty"),
        Case("CLI", "`--doc -` with bytes that are not UTF-8 on stdin",
             cli("run", "--doc", "-", *q, stdin=b"ok \xff\xfe"), "exit 2",
             "standard input is not UTF-8 text (byte 3: invalid start byte)"),
        Case("CLI", "a blank `--branch`", cli(*run, "--branch", "   "), "exit 2",
             "branch 'b1': the prompt is empty"),
        Case("CLI", "a `--branch` holding an undecodable byte (`$'\\xff'`)",
             cli(*run, "--branch", " Q \udcff"), "exit 2",
             "prompt is not valid UTF-8 text (character 3: surrogates not allowed)"),
        Case("CLI", "`--temp nan`", cli(*run, *q, "--temp", "nan"), "exit 2",
             "temperature must be a finite number, got nan"),
        Case("CLI", "`--temp inf`", cli(*run, *q, "--temp", "inf"), "exit 2",
             "temperature must be a finite number, got inf"),
        Case("CLI", "`--temp -1`", cli(*run, *q, "--temp", "-1"), "exit 2",
             "temperature must be >= 0, got -1.0"),
        Case("CLI", "`--temp abc`", cli(*run, *q, "--temp", "abc"), "exit 2",
             "argument --temp: invalid float value: 'abc'"),
        Case("CLI", "`--seed -1`", cli(*run, *q, "--seed", "-1"), "exit 2",
             "seed must be in [0, 2**32), got -1"),
        Case("CLI", "`-t 0`", cli(*run, *q, "-t", "0"), "exit 2",
             "argument -t/--threads: must be >= 1, got 0"),
        Case("CLI", "`-t 1000` (ggml allows 512)", cli(*run, *q, "-t", "1000"), "exit 2",
             "threads must be at most 512 (ggml's limit), got 1000"),
        Case("CLI", "`-n 0`", cli(*run, *q, "-n", "0"), "exit 2",
             "argument -n/--n-predict: must be >= 1, got 0"),
        Case("CLI", "`-c 10` (too small for document and branches)",
             cli(*run, *q, "-c", "10"), "exit 2", "tokens > n_ctx=10"),
        Case("CLI", "`--mode turbo`", cli(*run, *q, "--mode", "turbo"), "exit 2",
             "argument --mode: invalid choice: 'turbo'"),
        Case("CLI", "300 `--branch` in fork mode (llama.cpp: 256 sequences)",
             cli(*run, *many), "exit 2",
             "301 sequences, but llama.cpp allows 256: use host mode or at most 255 branches"),
        Case("CLI", "a PIPELINE.toml and `--doc` together",
             cli("run", "p.toml", "--doc", "doc.txt"), "exit 2",
             "give either PIPELINE.toml or --doc/--branch, not both"),
        Case("CLI", "literal braces in a prompt (`{\"a\": 1} and {x}`)",
             cli(*run, "--branch", ' JSON {"a": 1} and {x}:', "-n", "2"), "exit 0", ""),
        Case("model file", "`-m` a missing file", cli(*run, *q, "-m", "no.gguf", model=False),
             "exit 2", "model file not found"),
        Case("model file", "`-m` a directory", cli(*run, *q, "-m", "folder", model=False),
             "exit 2", "model path is not a file"),
        Case("model file", "`-m` a text file", cli(*run, *q, "-m", "doc.txt", model=False),
             "exit 2", "is not a GGUF file (magic b'The ', size 79 bytes)"),
        Case("model file", "`-m` a GGUF cut to 64 KiB",
             cli(*run, *q, "-m", "cut.gguf", model=False), "exit 2",
             "truncated, corrupt or unsupported GGUF"),
        Case("model file", "`-m` a file that cannot be read (`/proc/self/mem`: EIO)",
             cli(*run, *q, "-m", "/proc/self/mem", model=False), "exit 2",
             "cannot read model file"),
        Case("snapshot file", "`--snapshot` a missing file",
             cli("run", "--snapshot", "no.swkv", *q), "exit 2", "snapshot file not found"),
        Case("snapshot file", "`--snapshot` a text file",
             cli("run", "--snapshot", "doc.txt", *q), "exit 2",
             "doc.txt is not a SwarmKV snapshot (no SWKV magic)"),
        Case("snapshot file", "`snapshot create -o` a directory",
             cli("snapshot", "create", "--doc", "doc.txt", "-o", "folder"), "exit 2",
             "is a directory"),
    ]  # fmt: skip


def _toml_cases() -> list[Case]:
    two = branches("a: A", "b: B")
    return [
        Case("TOML", "`n_batch = 1` with 2 branches in fork mode",
             toml("[settings]\nn_batch = 1\n" + two), "exit 2",
             "fork mode needs n_batch >= 3 (one output row per sequence"),
        Case("TOML", "`top_p = nan`", toml(branches("a: A") + "top_p = nan\n"), "exit 2",
             "branch[1] 'a': 'top_p' must be a finite number, got float nan"),
        Case("TOML", "`temperature = inf` in [settings]",
             toml("[settings]\ntemperature = inf\n" + two), "exit 2",
             "[settings]: 'temperature' must be a finite number, got float inf"),
        Case("TOML", "a misspelt key", toml(branches("a: A") + "n_predcit = 3\n"), "exit 2",
             "unknown key 'n_predcit'; did you mean 'n_predict'?"),
        Case("TOML", "a dependency cycle", toml(branches("a: A after=b", "b: B after=a")),
             "exit 2", "dependency cycle"),
        Case("TOML", "`{doc}` in a prompt (the document is not a branch)",
             toml(branches("a: {doc} after=doc")), "exit 2",
             "prompt uses {doc}, which is not a branch; write {{doc}} for the literal text"),
        Case("TOML", "`{a}` in a prompt, but `a` not in `after`",
             toml(branches("a: A", "b: Was {a} right?")), "exit 2",
             "prompt uses {a}, but 'a' is not in its after="),
        Case("TOML", "a `snapshot` that is a text file",
             toml('snapshot = "doc.txt"\n' + two), "exit 2", "is not a SwarmKV snapshot"),
        Case("TOML", "a file that is not UTF-8", cli("run", "notutf8.toml"), "exit 2",
             "notutf8.toml: not valid TOML: 'utf-8' codec can't decode byte 0xff"),
        Case("TOML", "a syntax error", cli("run", "syntax.toml"), "exit 2",
             "syntax.toml: not valid TOML: Expected ']' at the end of a table declaration"),
        Case("TOML", "a document named `wave-9` (fork's internal nodes are wave-N)",
             toml('name = "wave-9"\n' + two), "exit 0", ""),
        Case("TOML", "a branch named `q1.summary`, used as `{q1.summary}`",
             toml(branches("q1.summary: A", "b: Was {q1.summary} right? after=q1.summary")),
             "exit 0", ""),
    ]  # fmt: skip


def _api_cases() -> list[Case]:
    return [
        Case("Batch", "`add` a token id of 2**40", api(_batch_add(2**40, 0)), "BatchError",
             "token id 1099511627776 is out of range [0, 2**31)"),
        Case("Batch", "`add` at position -1", api(_batch_add(5, -1)), "BatchError",
             "position -1 is out of range [0, 2**31)"),
        Case("Batch", "`add` a token id of 1.5", api(_batch_add(1.5, 0)), "BatchError",
             "token id must be an integer, got 1.5"),
        Case("Batch", "`add` with seq_id -1", api(_batch_add(5, 0, -1)), "BatchError",
             "seq_id -1 is out of range [0, 2**31)"),
        Case("Context", "`decode` a token id past the vocabulary", api(_decode_token(10**6)),
             "BatchError", "token id 1000000 is out of range [0, "),
        Case("Context", "`n_ctx` past the model's training context",
             api(_context(n_ctx=10**6)), "ContextCreateError", "exceeds what"),
        Case("Context", "`n_threads=513`", api(_context(n_ctx=256, n_threads=513)),
             "ConfigError", "n_threads must be in [1, 512] (ggml's limit), got 513"),
        Case("Context", "`n_seq_max=300`", api(_context(n_ctx=256, n_seq_max=300)),
             "ConfigError", "n_seq_max must be in [1, 256], got 300"),
        Case("Model", "`close()` while a context is open", api(_close_model_under_a_context),
             "SwarmKVError", "context(s) made from"),
        Case("Pipeline", "`branch(n_predict=0)`", api(_pipeline({"n_predict": 0})),
             "ConfigError", "branch 'b': n_predict must be >= 1, got 0"),
        Case("Pipeline", "`branch(top_p=1.5)`", api(_pipeline({"top_p": 1.5})),
             "ConfigError", "top_p must be in [0, 1], got 1.5"),
        Case("Pipeline", "`branch(temperature=nan)`",
             api(_pipeline({"temperature": float("nan")})), "ConfigError",
             "temperature must be a finite number, got nan"),
        Case("Pipeline", "`run(timeout_s=nan)`", api(_pipeline(timeout_s=float("nan"))),
             "ConfigError", "timeout_s must be a finite number of seconds > 0, got nan"),
        Case("Pipeline", "`run(mode=\"turbo\")`", api(_pipeline(mode="turbo")),
             "ConfigError", "turbo"),
        Case("Pipeline", "`prefill(snapshot=)` of another model",
             api(_snapshot_of_another_model), "SnapshotMismatchError", "model_fingerprint is"),
        Case("HostBufferPool", "`alloc(0)`", api(_pool("zero")), "ConfigError",
             "nbytes must be >= 1, got 0"),
        Case("HostBufferPool", "a buffer's view after `release()`", api(_pool("released")),
             "ClosedError", "HostBuffer used after release"),
        Case("HostBufferPool", "`alloc` after `close()`", api(_pool("closed")), "ClosedError",
             "HostBufferPool is closed"),
        Case("KVSnapshot", "`restore` into a context with another `type_k`",
             api(_restore_other_settings), "SnapshotMismatchError",
             "context setting type_k is 'f16' in the snapshot, 'f32'"),
    ]  # fmt: skip


def _snapshot_file_cases() -> list[Case]:
    return [
        Case("snapshot file", "`KVSnapshot.load` a file cut in half",
             api(_load(_snapshot_variant("truncated"))), "SnapshotMismatchError",
             "(truncated or padded)"),
        Case("snapshot file", "`KVSnapshot.load` a header claiming 8 GiB of state",
             api(_load(_snapshot_variant("claims"))), "SnapshotMismatchError",
             "state length is 8589934592 bytes in the header, the file holds"),
        Case("snapshot file", "`swarmkv snapshot info` a file cut in half",
             snapshot_info("truncated"), "exit 2", "(truncated or padded)"),
        Case("snapshot file", "`KVSnapshot.load` a text file",
             api(_load(lambda w: w.dir / "doc.txt")), "SnapshotMismatchError",
             "is not a SwarmKV snapshot (no SWKV magic)"),
        Case("snapshot file", "`KVSnapshot.load` a directory",
             api(_load(lambda w: w.dir / "folder")), "SnapshotMismatchError",
             "is a directory, not a snapshot file"),
        Case("snapshot file", "`KVSnapshot.load` a file made by another llama.cpp commit",
             api(_load(_snapshot_variant("commit"))), "SnapshotMismatchError",
             "llama_cpp_commit is '000000000000' in the file, this build runs"),
        Case("snapshot file", "`KVSnapshot.load` a file with one state bit flipped",
             api(_load(_snapshot_variant("bitflip"))), "SnapshotMismatchError",
             "state checksum mismatch (corrupt)"),
    ]  # fmt: skip


CASES = [*_cli_cases(), *_toml_cases(), *_api_cases(), *_snapshot_file_cases()]


# -- the table with full messages ---------------------------------------------------------
def markdown(rows: list[tuple[Case, str, str]]) -> str:
    """The table with full messages: where, the input, the error kind, the message (abridged)."""
    out = ["| where | bad input | error | message (abridged) |", "|---|---|---|---|"]
    for case, kind, message in rows:
        short = message if len(message) <= 140 else message[:137] + "..."
        text = short.replace("|", "\\|") or "(none: it works)"
        out.append(f"| {case.where} | {case.what} | {kind} | `{text}` |")
    return "\n".join(out)


if __name__ == "__main__":
    from swarmkv.llama.models import default_model_path

    with tempfile.TemporaryDirectory() as tmp:
        work = Work(Path(tmp), default_model_path())
        prepare(work)
        print(markdown([(c, *c.run(work)) for c in CASES]))
