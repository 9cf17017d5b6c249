"""Bad input raises a specific SwarmKVError subclass and never reaches a C++ abort.

The library validates in Python before every native call; these tests pin each check. The
cases where llama.cpp itself would GGML_ASSERT (and kill the process) run in a subprocess, so
a regression fails one test instead of taking the whole session down.
"""

from __future__ import annotations

import logging
import os
import subprocess
import textwrap
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import swarmkv
from swarmkv import (
    Batch,
    BatchError,
    ClosedError,
    ConfigError,
    Context,
    ContextConfig,
    ContextCreateError,
    HostBufferPool,
    Model,
    ModelLoadError,
    Sampler,
    SnapshotMismatchError,
    SwarmKVError,
)
from swarmkv.errors import SwarmKVWarning

from support.proc import python_cmd, run

SMALL: dict[str, Any] = {"n_ctx": 256, "n_batch": 64, "n_threads": 1}
Prefill = Callable[..., int]


# -- model files ---------------------------------------------------------------------------


def test_missing_model_path(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not found"):
        Model(tmp_path / "absent.gguf")


def test_directory_as_model_path(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not a file"):
        Model(tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file of mode 000")
def test_model_file_without_read_permission(tiny_model_path: Path, tmp_path: Path) -> None:
    path = tmp_path / "locked.gguf"
    path.write_bytes(tiny_model_path.read_bytes()[:64])
    path.chmod(0)
    with pytest.raises(ModelLoadError, match=f"cannot read model file {path}: Permission denied"):
        Model(path)


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="needs Linux's /proc")
def test_model_file_that_fails_to_read() -> None:
    # a regular file whose read fails for every user (root included): EIO at offset 0
    with pytest.raises(ModelLoadError, match=r"cannot read model file .*: Input/output error"):
        Model("/proc/self/mem")


@pytest.mark.parametrize("content", [b"", b"GGU", b"not a model at all\n" * 64])
def test_non_gguf_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        Model(path)


@pytest.mark.parametrize("keep", [0.5, 0.001])
def test_truncated_gguf(tiny_model_path: Path, tmp_path: Path, keep: float) -> None:
    data = tiny_model_path.read_bytes()
    path = tmp_path / "truncated.gguf"
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ModelLoadError, match="llama_model_load_from_file failed"):
        Model(path)


# -- context configuration -----------------------------------------------------------------


def test_n_ctx_beyond_n_ctx_train(tiny_model: Model) -> None:
    with pytest.raises(ContextCreateError, match="n_ctx_train=4096"):
        Context(tiny_model, n_ctx=4097, n_threads=1)


def test_context_larger_than_memory_is_refused_before_allocating(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from support.tinymodel import make_tiny_model

    path = make_tiny_model(tmp_path / "long.gguf", n_ctx_train=2**30)
    with Model(path) as model:
        assert model.n_ctx_train == 2**30
        # 2 layers x 2**29 cells x 2 kv heads x (16 + 16) dims x 2 bytes = 128 GiB
        with (
            caplog.at_level(logging.DEBUG, logger="swarmkv.llama"),
            pytest.raises(ContextCreateError, match="memory is available"),
        ):
            Context(model, n_ctx=2**29, n_batch=512, n_threads=1)
    # llama_init_from_model was never called: it would have logged its parameters
    assert not [r for r in caplog.records if "llama_context" in r.getMessage()]


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"n_ctx": 256, "n_batch": 0}, "n_batch"),
        ({"n_ctx": 0}, "n_ctx"),
        ({**SMALL, "n_seq_max": 0}, "n_seq_max"),
        ({**SMALL, "n_seq_max": 257}, "n_seq_max"),
        ({**SMALL, "n_ubatch": 128}, "n_ubatch"),
        ({**SMALL, "n_threads": 0}, "n_threads"),
        ({**SMALL, "n_threads": 513}, r"n_threads must be in \[1, 512\]"),
        ({**SMALL, "n_threads_batch": 3_000_000_000}, "n_threads_batch"),
        ({**SMALL, "flash_attn": "maybe"}, "flash_attn"),
        ({**SMALL, "type_k": "f8"}, "type_k"),
    ],
)
def test_bad_context_config(tiny_model: Model, overrides: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Context(tiny_model, **overrides)


def _run_isolated(script: str) -> subprocess.CompletedProcess[str]:
    """Run a snippet in a fresh interpreter: a GGML_ASSERT there fails one test, not pytest."""
    # GGML_NO_BACKTRACE: no gdb attach on abort
    cmd = python_cmd("-c", textwrap.dedent(script))
    return run(cmd, cwd=Path.cwd(), timeout=60, env={"GGML_NO_BACKTRACE": "1"})


def test_n_seq_max_above_n_batch_raises_instead_of_aborting(tiny_model_path: Path) -> None:
    """llama.cpp reserves max(n_outputs, n_seq_max) output rows, at most n_outputs_max (which
    defaults to n_batch), and GGML_ASSERTs past that (llama-context.cpp, output_reserve). The
    library must refuse the config with a ConfigError, or create a context that works."""
    proc = _run_isolated(
        f"""
        import swarmkv
        model = swarmkv.Model({str(tiny_model_path)!r})
        try:
            ctx = swarmkv.Context(model, n_ctx=4096, n_batch=64, n_threads=1, n_seq_max=65)
        except swarmkv.ConfigError:
            print("raised ConfigError")
        else:
            with swarmkv.Batch(4, 1) as batch:
                batch.add(1, 0, [64], logits=True)
                ctx.decode(batch)
            print("created", ctx.n_seq_max, ctx.logits(0).shape[0])
        """
    )
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-1000:]}"
    assert proc.stdout.split() in (["raised", "ConfigError"], ["created", "65", "32000"])


def test_partial_seq_cp_across_kv_streams_raises_instead_of_aborting(
    tiny_model_path: Path,
) -> None:
    """With kv_unified=False (the default) each sequence has its own KV stream and llama.cpp
    GGML_ASSERTs on a seq_cp of part of a sequence (llama-kv-cache.cpp, seq_cp: "only
    supported for full KV buffers"). The library must raise, or copy the range."""
    proc = _run_isolated(
        f"""
        import swarmkv
        model = swarmkv.Model({str(tiny_model_path)!r})
        ctx = swarmkv.Context(model, n_ctx=512, n_batch=64, n_threads=1, n_seq_max=2)
        with swarmkv.Batch(16) as batch:
            batch.add_sequence(range(100, 110), 0, 0)
            ctx.decode(batch)
        try:
            ctx.seq_cp(0, 1, 5)
        except swarmkv.ConfigError:
            print("raised ConfigError")
        else:
            print("copied", ctx.seq_pos_min(1), ctx.seq_pos_max(1))
        """
    )
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-1000:]}"
    assert proc.stdout.split() in (["raised", "ConfigError"], ["copied", "5", "9"])


# -- batches and decode --------------------------------------------------------------------


@pytest.fixture
def ctx2(tiny_model: Model) -> Iterator[Context]:
    with Context(tiny_model, n_ctx=512, n_batch=64, n_threads=1, n_seq_max=2) as ctx:
        yield ctx


def test_batch_beyond_capacity() -> None:
    with Batch(2) as batch:
        batch.add(10, 0, [0])
        batch.add(11, 1, [0])
        with pytest.raises(BatchError, match="full"):
            batch.add(12, 2, [0])
        assert batch.n_tokens == 2


@pytest.mark.parametrize(("capacity", "n_seq_max"), [(0, 1), (4, 0)])
def test_bad_batch_shape(capacity: int, n_seq_max: int) -> None:
    with pytest.raises(BatchError):
        Batch(capacity, n_seq_max)


def test_bad_batch_rows() -> None:
    with Batch(4, 2) as batch:
        with pytest.raises(BatchError, match="seq ids"):
            batch.add(10, 0, [])
        with pytest.raises(BatchError, match="seq ids"):
            batch.add(10, 0, [0, 1, 2])
        with pytest.raises(BatchError, match="position"):
            batch.add(10, -1, [0])
        with pytest.raises(BatchError, match="seq_id"):
            batch.add(10, 0, [-1])
        with pytest.raises(BatchError, match="at least one"):
            batch.add_sequence([], 0, 0)
        assert batch.n_tokens == 0


def test_decode_more_than_n_batch_tokens(ctx2: Context) -> None:
    with Batch(100) as batch:
        batch.add_sequence(range(100, 165), 0, 0)
        with pytest.raises(BatchError, match="exceeds n_batch=64"):
            ctx2.decode(batch)
    assert ctx2.seq_pos_max(0) is None


def test_decode_empty_batch(ctx2: Context) -> None:
    with Batch(8) as batch, pytest.raises(BatchError, match="empty"):
        ctx2.decode(batch)


def test_position_gap_within_a_batch() -> None:
    with Batch(8) as batch:
        batch.add(10, 0, [0])
        with pytest.raises(BatchError, match="position gap in seq 0"):
            batch.add(11, 2, [0])
        batch.add(11, 1, [0])  # the failed row left no trace
        assert batch.seq_spans() == {0: (0, 1)}


def test_position_gap_against_the_context_memory(ctx2: Context, prefill: Prefill) -> None:
    prefill(ctx2, [1, 100, 101], seq_id=0)
    with Batch(8) as batch:
        batch.add_sequence([102], 5, 0)
        with pytest.raises(BatchError, match="memory ends at pos 2"):
            ctx2.decode(batch)
        batch.clear()
        batch.add_sequence([102], 2, 0)  # overlapping is a gap too
        with pytest.raises(BatchError, match="must be 3"):
            ctx2.decode(batch)
    assert ctx2.seq_pos_max(0) == 2


def test_positions_past_n_ctx(tiny_model: Model) -> None:
    with Context(tiny_model, n_ctx=256, n_batch=64, n_threads=1) as ctx, Batch(8) as batch:
        batch.add_sequence([10, 11], 255, 0)
        with pytest.raises(BatchError, match="n_ctx=256"):
            ctx.decode(batch)


def test_seq_id_outside_n_seq_max(ctx2: Context) -> None:
    with Batch(8, 2) as batch:
        batch.add(10, 0, [2], logits=True)
        with pytest.raises(BatchError, match="seq_id 2 outside"):
            ctx2.decode(batch)
    for op in (ctx2.seq_pos_max, ctx2.seq_pos_min, ctx2.seq_keep, ctx2.state_seq_size):
        with pytest.raises(BatchError):
            op(5)
    with pytest.raises(BatchError):
        ctx2.seq_cp(0, 2)


def test_token_outside_the_vocabulary_is_refused_before_decoding(ctx2: Context) -> None:
    with Batch(8) as batch:
        batch.add(40000, 0, [0], logits=True)
        with pytest.raises(BatchError, match=r"token id 40000 is out of range \[0, 32000\)"):
            ctx2.decode(batch)
    assert ctx2.seq_pos_max(0) is None  # nothing reached llama_decode


@pytest.mark.parametrize(
    ("token", "pos", "seq_id", "match"),
    [
        (2**40, 1, 0, r"token id 1099511627776 is out of range \[0, 2\*\*31\)"),
        (-1, 1, 0, r"token id -1 is out of range \[0, 2\*\*31\)"),
        (1.5, 1, 0, "token id must be an integer, got 1.5"),
        (True, 1, 0, "token id must be an integer, got True"),
        (5, 2**31, 0, r"position 2147483648 is out of range \[0, 2\*\*31\)"),
        (5, 1, 2**40, r"seq_id 1099511627776 is out of range \[0, 2\*\*31\)"),
    ],
)
def test_a_refused_row_leaves_the_batch_usable(
    ctx2: Context, token: object, pos: int, seq_id: int, match: str
) -> None:
    # a token id of 2**40 used to raise OverflowError from cffi after the sequence span was
    # already recorded, so the next valid row was refused as a position gap
    with Batch(4, 2) as batch:
        batch.add(1, 0, [0])
        with pytest.raises(BatchError, match=match):
            batch.add(token, pos, [seq_id])  # type: ignore[arg-type]
        assert batch.add(100, 1, [0], logits=True) == 1
        assert batch.tokens() == [1, 100] and batch.seq_spans() == {0: (0, 1)}
        ctx2.decode(batch)
    assert np.isfinite(ctx2.logits(1)).all()


def test_sampler_on_a_row_without_logits_raises(ctx2: Context) -> None:
    with Batch(8) as batch, Sampler() as sampler:
        batch.add_sequence([1, 100, 101], 0, 0, logits_last=False)
        ctx2.decode(batch)
        for row in (0, 2, -1, 7):
            with pytest.raises(SwarmKVError, match="no logits"):
                sampler.sample(ctx2, row)
        batch.clear()
        batch.add_sequence([102, 103], 3, 0)
        ctx2.decode(batch)
        with pytest.raises(SwarmKVError, match="no logits for batch row 0"):
            sampler.sample(ctx2, 0)
        assert 0 <= sampler.sample(ctx2, 1) < ctx2.n_vocab


# -- state bytes ---------------------------------------------------------------------------


def _state_of(ctx: Context, seq_id: int) -> bytes:
    buf = bytearray(ctx.state_seq_size(seq_id))
    ctx.state_seq_get(seq_id, memoryview(buf))
    return bytes(buf)


@pytest.mark.parametrize("kind", ["random", "zeros", "short", "one byte"])
def test_restoring_garbage_bytes(ctx2: Context, prefill: Prefill, kind: str) -> None:
    prefill(ctx2, [1, 100, 101, 102], seq_id=0)
    n = len(_state_of(ctx2, 0))
    rng = np.random.default_rng(7)
    data = {
        "random": rng.integers(0, 256, n, dtype=np.uint8).tobytes(),
        "zeros": bytes(n),
        "short": _state_of(ctx2, 0)[: n // 2],
        "one byte": b"\x01",
    }[kind]
    with pytest.raises(SnapshotMismatchError, match="consumed"):
        ctx2.state_seq_set(1, data)
    assert ctx2.seq_pos_max(0) == 3  # the other sequence is untouched


def test_state_seq_get_into_a_small_buffer(ctx2: Context, prefill: Prefill) -> None:
    prefill(ctx2, [1, 100, 101], seq_id=0)
    need = ctx2.state_seq_size(0)
    with pytest.raises(BatchError, match=f"needs {need} bytes"):
        ctx2.state_seq_get(0, memoryview(bytearray(need - 1)))


def test_raw_state_of_another_model_does_not_crash(
    ctx2: Context, other_tiny_model: Model, prefill: Prefill
) -> None:
    """The state format carries no weights identity: with identical shapes llama.cpp takes the
    other model's bytes whole, which is why swarmkv.restore checks the model fingerprint."""
    with Context(other_tiny_model, n_ctx=512, n_batch=64, n_threads=1) as other:
        prefill(other, [1, 100, 101, 102, 103], seq_id=0)
        foreign = _state_of(other, 0)
    try:
        consumed = ctx2.state_seq_set(0, foreign)
    except SwarmKVError:
        assert ctx2.seq_pos_max(0) is None
    else:
        assert consumed == len(foreign)
        assert ctx2.seq_pos_max(0) == 4


def test_restore_of_a_snapshot_from_another_model(
    ctx2: Context, other_tiny_model: Model, prefill: Prefill
) -> None:
    tokens = (1, 100, 101, 102, 103)
    with (
        HostBufferPool() as pool,
        Context(other_tiny_model, n_ctx=512, n_batch=64, n_threads=1) as other,
    ):
        prefill(other, tokens, seq_id=0)
        snap = swarmkv.capture(other, 0, pool, tokens)
        prefill(ctx2, [1, 200, 201], seq_id=0)
        with pytest.raises(SnapshotMismatchError, match="model"):
            swarmkv.restore(ctx2, 0, snap)
        assert ctx2.seq_pos_max(0) == 2  # checked before the sequence was cleared


# -- use after close -----------------------------------------------------------------------


def test_model_use_after_close(tiny_model_path: Path) -> None:
    model = Model(tiny_model_path)
    model.close()
    model.close()  # idempotent
    assert model.closed
    for use in (
        lambda: model.n_layer,
        lambda: model.n_vocab,
        lambda: model.tokenize("hi"),
        lambda: model.token_to_piece(1),
        lambda: model.meta("general.name"),
        lambda: Context(model, **SMALL),
    ):
        with pytest.raises(ClosedError, match="Model is closed"):
            use()


def test_context_use_after_close(tiny_model: Model) -> None:
    ctx = Context(tiny_model, **SMALL)
    ctx.close()
    ctx.close()
    assert ctx.closed
    with Batch(4) as batch, Sampler() as sampler:
        batch.add(1, 0, [0], logits=True)
        for use in (
            lambda: ctx.decode(batch),
            lambda: ctx.logits(0),
            lambda: ctx.seq_pos_max(0),
            lambda: ctx.seq_rm(0),
            lambda: ctx.memory_clear(),
            lambda: ctx.state_seq_size(0),
            lambda: ctx.state_seq_set(0, b"x"),
            lambda: ctx.perf(),
            lambda: sampler.sample(ctx, 0),
        ):
            with pytest.raises(ClosedError, match="Context is closed"):
                use()


def test_batch_and_sampler_use_after_close(ctx2: Context) -> None:
    batch = Batch(4)
    batch.add(1, 0, [0], logits=True)
    batch.close()
    batch.close()
    with pytest.raises(ClosedError, match="Batch is closed"):
        ctx2.decode(batch)
    with pytest.raises(ClosedError, match="Batch is closed"):
        batch.add(2, 1, [0])
    with pytest.raises(ClosedError, match="Batch is closed"):
        batch.clear()

    sampler = Sampler()
    sampler.close()
    with Batch(4) as live:
        live.add(1, 0, [0], logits=True)
        ctx2.decode(live)
    with pytest.raises(ClosedError, match="Sampler is closed"):
        sampler.sample(ctx2, 0)
    with pytest.raises(ClosedError, match="Sampler is closed"):
        sampler.reset()


def test_more_threads_than_cpus_warns_once(tiny_model: Model) -> None:
    too_many = len(os.sched_getaffinity(0)) + 1
    config = ContextConfig(n_ctx=256, n_batch=64, n_threads=too_many)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("default")  # Python's own filter: once per message and place
        for _ in range(3):  # host mode validates one config per branch context
            config.validate(tiny_model)
    seen = [str(w.message) for w in record if issubclass(w.category, SwarmKVWarning)]
    assert len(seen) == 1 and f"n_threads={too_many} exceeds" in seen[0]


# -- pipelines -----------------------------------------------------------------------------

PIPE_DOC = "SwarmKV prefills a shared document once and fans it out to many branches. " * 4


@pytest.fixture
def no_contexts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if a llama context is created: the check must come first."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a llama context was created before the input was checked")

    monkeypatch.setattr(Context, "__init__", refuse)


@pytest.mark.usefixtures("no_contexts")
@pytest.mark.parametrize(
    ("setup", "run", "match"),
    [
        (
            {"n_batch": 1},
            {"mode": "fork"},
            r"fork mode needs n_batch >= 3 \(one output row per sequence",
        ),
        ({}, {"timeout_s": float("nan")}, "timeout_s must be a finite number of seconds > 0"),
        ({}, {"timeout_s": float("inf")}, "timeout_s must be a finite number of seconds > 0"),
    ],
)
def test_pipeline_input_refused_before_any_context(
    tiny_model: Model, setup: dict[str, Any], run: dict[str, Any], match: str
) -> None:
    from swarmkv import Pipeline

    with Pipeline(tiny_model, n_threads=1, **setup) as p:
        p.prefill("doc", text=PIPE_DOC)
        p.branch("a", prompt=" A", n_predict=2)
        p.branch("b", prompt=" B", n_predict=2)
        with pytest.raises(ConfigError, match=match):
            p.run(**run)


@pytest.mark.usefixtures("no_contexts")
def test_more_branches_than_llama_sequences(tiny_model: Model) -> None:
    from swarmkv import Pipeline

    with Pipeline(tiny_model, n_threads=1) as p:
        p.prefill("doc", text=PIPE_DOC)
        for i in range(256):
            p.branch(f"b{i}", prompt=" Q", n_predict=1)
        with pytest.raises(ConfigError, match=r"257 sequences, but llama\.cpp allows 256"):
            p.run(mode="fork")


def test_fork_with_names_like_its_internal_nodes_and_dotted_placeholders(
    tiny_model: Model,
) -> None:
    """fork mode runs its branches as DAG nodes named wave-N: a document or branch named so
    must not collide with them; `{q1.summary}` is a placeholder (str.format read the dot as
    attribute access)."""
    from swarmkv import Pipeline

    with Pipeline(tiny_model, n_threads=1) as p:
        p.prefill("wave-0", text=PIPE_DOC)
        p.branch("wave-1", prompt=" Q", n_predict=3)
        p.branch("q1.summary", prompt=" S", n_predict=3)
        p.branch("b", prompt=" Was {q1.summary} right?", after=["q1.summary"], n_predict=3)
        result = p.run(mode="fork")
    assert result.ok, {n: o.reason for n, o in result.outcomes.items()}
    assert list(result.branches) == ["wave-1", "q1.summary", "b"]
    rendered = f" Was {result['q1.summary'].text} right?"
    assert result["b"].prompt_tokens == len(tiny_model.tokenize(rendered, add_special=False))


def test_swarm_refuses_non_finite_timeouts(tiny_model: Model) -> None:
    # Condition.wait(nan) and Event.wait(nan) return at once: a NaN timeout made
    # add_document spin and result() raise TimeoutError "after nan s"
    from swarmkv.swarm import Swarm

    nan, message = float("nan"), "must be a finite number of seconds >= 0, got nan"
    with Swarm(tiny_model, n_ctx=512, max_live=1, max_docs=1, n_threads=1) as swarm:
        with pytest.raises(ConfigError, match=f"timeout_s {message}"):
            swarm.add_document("d", text=PIPE_DOC, timeout_s=nan)
        swarm.add_document("d", text=PIPE_DOC)  # nothing was queued by the refused call
        handle = swarm.submit("d", " Q", n_predict=2)
        with pytest.raises(ConfigError, match=f"timeout {message}"):
            handle.result(timeout=nan)
        with pytest.raises(ConfigError, match="timeout_s must be a finite number"):
            swarm.drain(timeout_s=float("inf"))
        assert len(handle.result(timeout=60).tokens) == 2
