"""The error contract, without native code: one-time warnings are Python warnings
(SwarmKVWarning, filtered once per message and place by Python itself), and Ctrl-C belongs to
the guarded run it interrupted, not to the rest of the process."""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import swarmkv.cli.app as cli_app
from swarmkv.errors import SwarmKVWarning
from swarmkv.llama.config import ContextConfig, default_threads
from swarmkv.pipeline.dag import Dag, NodeContext
from swarmkv.pipeline.nodes import BranchNode, PrefillNode
from swarmkv.pipeline.spec import PipelineSpec
from swarmkv.process.interrupt import INTERRUPT, Interrupted, check, ctrl_c_sets_flag


@pytest.fixture(autouse=True)
def clear_interrupt() -> Iterator[None]:
    INTERRUPT.clear()
    yield
    INTERRUPT.clear()


def _ctrl_c() -> None:
    """What a user's Ctrl-C does: SIGINT to this process, handled at the next bytecode."""
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)


# -- 4. one-time warnings are Python warnings ---------------------------------------------


def _seen(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, SwarmKVWarning)]


def test_a_stray_word_in_braces_warns_once_through_python_warnings() -> None:
    b = BranchNode("b", " Answer as {format}:", ())
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("default")  # Python's own: once per message and place
        for _ in range(3):  # the CLI validates a spec when loading it and again to run it
            PipelineSpec(PrefillNode("doc", "D."), (b,)).validate()
    assert _seen(record) == [
        "branch 'b': {format} names no upstream branch in after=, so it stays as literal text"
    ]
    assert issubclass(SwarmKVWarning, UserWarning)


def test_a_stray_word_warning_obeys_warning_filters() -> None:
    spec = PipelineSpec(PrefillNode("doc", "D."), (BranchNode("b", " As {fmt}:", ()),))
    with warnings.catch_warnings():
        warnings.simplefilter("error", SwarmKVWarning)
        with pytest.raises(SwarmKVWarning, match=r"\{fmt\} names no upstream branch"):
            spec.validate()
    with pytest.warns(SwarmKVWarning, match=r"\{fmt\}"):  # again: no module-level memory
        spec.validate()


def test_more_threads_than_cpus_warns_once_through_python_warnings() -> None:
    model: Any = SimpleNamespace(n_ctx_train=4096, path=Path("tiny.gguf"))
    too_many = default_threads() + 1
    config = ContextConfig(n_ctx=256, n_batch=64, n_threads=too_many)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("default")
        for _ in range(3):  # host mode validates one config per branch context
            config.validate(model)
    assert _seen(record) == [
        f"n_threads={too_many} exceeds the {default_threads()} CPUs this process may use; "
        "decoding will be slower"
    ]
    with pytest.warns(SwarmKVWarning, match=f"n_threads={too_many} exceeds"):
        config.validate(model)


def test_the_cli_prints_a_swarmkv_warning_as_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def command(_args: argparse.Namespace) -> int:
        warnings.warn("something to know", SwarmKVWarning, stacklevel=1)
        return 0

    monkeypatch.setattr(cli_app, "parse_args", lambda _argv: argparse.Namespace(func=command))
    assert cli_app.main([]) == 0
    assert capsys.readouterr().err == "swarmkv: warning: something to know\n"


# -- 5. Ctrl-C belongs to the run it interrupted -------------------------------------------


def test_the_flag_is_cleared_when_the_guard_ends() -> None:
    with ctrl_c_sets_flag() as guard:
        _ctrl_c()
        assert INTERRUPT.is_set()
        with pytest.raises(Interrupted):
            check()
    assert not INTERRUPT.is_set(), "a later run in this process must not see it"
    assert guard.interrupted
    check()  # nothing to raise


def test_a_guard_without_ctrl_c_reports_none() -> None:
    with ctrl_c_sets_flag() as guard:
        pass
    assert not guard.interrupted


def test_an_inner_guard_leaves_the_outer_guards_flag() -> None:
    with ctrl_c_sets_flag() as outer:
        _ctrl_c()
        with ctrl_c_sets_flag() as inner:
            pass
        assert inner.interrupted
        assert INTERRUPT.is_set(), "the outer run was interrupted and must still stop"
    assert outer.interrupted
    assert not INTERRUPT.is_set()


def test_a_guard_off_the_main_thread_leaves_the_flag_alone() -> None:
    def worker() -> None:
        with ctrl_c_sets_flag():
            pass

    with ctrl_c_sets_flag() as guard:
        _ctrl_c()
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        assert INTERRUPT.is_set()
    assert guard.interrupted


def _spinning_dag() -> Dag:
    def node(ctx: NodeContext) -> str:
        for _ in range(20):
            ctx.check_cancelled()
            time.sleep(0.005)
        return "done"

    dag = Dag()
    dag.add("a", node)
    return dag


def test_a_dag_run_after_an_interrupted_one_succeeds() -> None:
    with ctrl_c_sets_flag():
        threading.Timer(0.02, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        with pytest.raises(Interrupted):
            _spinning_dag().run(timeout_s=30)
    result = _spinning_dag().run(timeout_s=30)  # the same process, later: not interrupted
    assert result["a"].status == "ok"


def test_the_cli_exits_130_once_then_runs_again(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(_args: argparse.Namespace) -> int:
        _ctrl_c()
        check()
        return 0

    def fine(_args: argparse.Namespace) -> int:
        check()
        return 0

    commands = iter([interrupted, fine])
    monkeypatch.setattr(
        cli_app, "parse_args", lambda _argv: argparse.Namespace(func=next(commands))
    )
    assert cli_app.main([]) == 130
    assert cli_app.main([]) == 0
