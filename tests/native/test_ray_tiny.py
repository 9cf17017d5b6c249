"""Ray fan-out (swarmkv.dist) on a local Ray instance with two workers, tiny model.

Tokens must equal a local run's however the branches are split; every refusal happens before
the driver prefills; a worker that dies fails its own branches, with the reason, and no other.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmkv import Pipeline
from swarmkv.errors import ClosedError, ConfigError, ContextBudgetError, PipelineError
from swarmkv.llama.model import Model
from swarmkv.process.interrupt import INTERRUPT, Interrupted

from support.proc import python_cmd, run, stderr_tail, swarmkv_cmd

ray = pytest.importorskip("ray", reason="the [test] extra installs ray; this install lacks it")

from swarmkv.dist import RayFanout  # noqa: E402

pytestmark = pytest.mark.slow  # the slow tier: Ray

DOC = "SwarmKV prefills a shared document once and fans its state out to many branches. " * 6


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    # logical CPUs for Ray's bookkeeping: the module's fan-out holds 2, the tests that start
    # their own workers 2 more (the two real cores are shared: these workers are tiny)
    ray.init(num_cpus=5, include_dashboard=False, logging_level="WARNING")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def fan(ray_local: None, tiny_model_path: Path) -> Iterator[RayFanout]:
    with RayFanout(tiny_model_path, workers=2, threads=1) as f:
        yield f


def pipeline(model: Model, n: int = 6) -> Pipeline:
    p = Pipeline(model, n_threads=1).prefill("doc", text=DOC)
    for i in range(n):
        p.branch(f"q{i}", prompt=f" Question {i}:", n_predict=6)
    p.branch("follow", prompt=" Given {q1}, then:", after=["doc", "q1"], n_predict=4)
    return p


@pytest.mark.parametrize("mode", ["fork", "host"])
def test_tokens_equal_a_local_run(fan: RayFanout, tiny_model: Model, mode: str) -> None:
    with pipeline(tiny_model) as p:
        local = p.run("fork")
        got = fan.run(p, mode)
    assert list(got.branches) == list(local.branches)  # the pipeline's order
    for name, b in local.branches.items():
        assert got[name].tokens == b.tokens, name
        assert got[name].text == b.text, name
    assert got.mode == f"ray:{mode}" and got.ok
    assert got.prefix_tokens == local.prefix_tokens and got.reused_tokens == 0
    dist = got.dist
    assert dist is not None and dist["driver_prefilled"] and not dist["lost_workers"]
    workers = dist["workers"]
    assert sorted(w["worker"] for w in workers) == [0, 1]
    assert sorted(w["branches"] for w in workers) == [3, 4]  # q1 and follow stay together
    assert len({w["pid"] for w in workers}) == 2
    assert all(w["get_ms"] >= 0 and w["restore_ms"] > 0 and w["run_ms"] > 0 for w in workers)
    assert got.snapshot_bytes == dist["snapshot_bytes"] > 0
    assert all(0 < b.first_token_ms <= b.end_ms <= got.e2e_ms for b in got.branches.values())
    assert "dist" in json.loads(json.dumps(got.to_dict()))


def test_a_snapshot_file_that_holds_the_document_is_sent_as_it_is(
    fan: RayFanout, tiny_model: Model, tmp_path: Path
) -> None:
    with pipeline(tiny_model) as p:
        local = p.run("fork")
        snap = p.snapshot()
        path = snap.save(tmp_path / "doc.swkv")
        snap.release()
    with Pipeline(tiny_model, n_threads=1).prefill("doc", snapshot=path) as p:
        for name, node in pipeline(tiny_model).branches.items():
            p.branches[name] = node
        got = fan.run(p)
    assert got.dist is not None and not got.dist["driver_prefilled"]
    assert got.reused_tokens == got.prefix_tokens
    assert {n: b.tokens for n, b in got.branches.items()} == {
        n: b.tokens for n, b in local.branches.items()
    }


def _never(*args: object, **kwargs: object) -> None:
    raise AssertionError("the driver prefilled before refusing")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda p: None, "runs modes fork, host, device, not 'baseline'"),
        (
            lambda p: p.branch("cb", prompt=" x", on_token=lambda *a: None),
            "on_token callback cannot run in a Ray worker",
        ),
        (
            lambda p: p.branch("w", prompt=" x", required_prefix_tokens=3),
            "required_prefix_tokens=3 is below the document's",
        ),
    ],
)
def test_refusals_come_before_the_prefill(
    fan: RayFanout, tiny_model: Model, change: object, match: str
) -> None:
    with pipeline(tiny_model) as p:
        change(p)  # type: ignore[operator]
        p.snapshot = _never  # type: ignore[method-assign]
        mode = "baseline" if "baseline" in match else "fork"
        with pytest.raises(ConfigError, match=match):
            fan.run(p, mode)


def test_a_pipeline_of_another_model_or_exactness_is_refused(
    fan: RayFanout, tiny_model: Model, other_tiny_model: Model
) -> None:
    with pipeline(other_tiny_model) as p, pytest.raises(ConfigError, match="another model"):
        fan.run(p)
    with Pipeline(tiny_model, exact=False).prefill("doc", text=DOC) as p:
        p.branch("q", prompt=" Q:")
        with pytest.raises(ConfigError, match="exact=False but the workers"):
            fan.run(p)


def test_a_worker_error_fails_its_branches_with_the_cause(
    fan: RayFanout, tiny_model: Model
) -> None:
    # n_ctx too small for either share: each worker's own budget check refuses its job
    with Pipeline(tiny_model, n_ctx=64, n_threads=1).prefill("doc", text=DOC[:150]) as p:
        for i in range(4):
            p.branch(f"q{i}", prompt=f" Question {i}:", n_predict=40)
        with pytest.raises(PipelineError, match="worker 0 failed"):
            fan.run(p)
        got = fan.run(p, raise_on_failure=False)
    assert not got.ok and got.outcomes["doc"].status == "ok"
    for i in range(4):
        o = got.outcomes[f"q{i}"]
        assert o.status == "failed" and isinstance(o.error, ContextBudgetError), o
    assert got.dist is not None and len(got.dist["lost_workers"]) == 2


def test_a_dead_worker_fails_only_its_share(ray_local: None, tiny_model_path: Path) -> None:
    with RayFanout(tiny_model_path, workers=2, threads=1) as f, Model(tiny_model_path) as m:
        ray.kill(f._actors[1])
        with pipeline(m, n=4) as p:
            got = f.run(p, raise_on_failure=False)
    failed = {n for n, o in got.outcomes.items() if o.status == "failed"}
    assert failed and failed.isdisjoint(got.branches)
    assert set(got.branches) | failed == {"q0", "q1", "q2", "q3", "follow"}
    assert all("worker 1 failed" in (got.outcomes[n].reason or "") for n in failed)


def test_a_timeout_closes_the_fan_out(ray_local: None, tiny_model_path: Path) -> None:
    f = RayFanout(tiny_model_path, workers=1, threads=1)
    with Model(tiny_model_path) as m, pipeline(m) as p:
        with pytest.raises(TimeoutError, match=r"did not finish within 0\.0 s"):
            f.run(p, timeout_s=0.0)
        with pytest.raises(ClosedError, match="closed"):
            f.run(p)


def test_ctrl_c_while_workers_run_ends_the_fan_out(ray_local: None, tiny_model_path: Path) -> None:
    f = RayFanout(tiny_model_path, workers=1, threads=1)
    with Model(tiny_model_path) as m, pipeline(m) as p:
        prefill = p.snapshot

        def prefill_then_ctrl_c(**kwargs: object) -> object:
            snap = prefill(**kwargs)  # type: ignore[arg-type]
            INTERRUPT.set()  # what swarmkv.process.interrupt's SIGINT handler does
            return snap

        p.snapshot = prefill_then_ctrl_c  # type: ignore[method-assign]
        try:
            with pytest.raises(Interrupted):
                f.run(p)
        finally:
            INTERRUPT.clear()
        assert f.workers == 0  # closed: its actors are gone


def test_the_cli_runs_on_ray_with_the_local_tokens(tiny_model_path: Path, tmp_path: Path) -> None:
    doc = tmp_path / "doc.txt"
    doc.write_text(DOC, encoding="utf-8")
    base = swarmkv_cmd("run", "-m", str(tiny_model_path), "--doc", str(doc))
    base += ["--branch", " A:", "--branch", " B:", "--branch", " C:", "-n", "5", "-t", "1"]

    def run_json(*extra: str) -> dict:
        proc = run([*base, *extra, "--json"], cwd=tmp_path)
        assert proc.returncode == 0, stderr_tail(proc)
        return json.loads(proc.stdout)

    local, remote = run_json(), run_json("--ray", "--workers", "2")
    assert [b["tokens"] for b in remote["branches"]] == [b["tokens"] for b in local["branches"]]
    assert remote["mode"] == "ray:fork" and len(remote["dist"]["workers"]) == 2


def test_workers_that_cannot_be_placed_time_out_clearly(
    ray_local: None, tiny_model_path: Path
) -> None:
    with pytest.raises(ConfigError, match=r"did not start within 3.0 s: each reserves 64 CPU"):
        RayFanout(tiny_model_path, workers=1, threads=64, start_timeout_s=3.0)


def test_bad_numbers_and_an_unreachable_cluster_are_config_errors(
    fan: RayFanout, tiny_model: Model, tiny_model_path: Path
) -> None:
    with pipeline(tiny_model) as p, pytest.raises(ConfigError, match="timeout_s must be"):
        fan.run(p, timeout_s=float("nan"))
    with pytest.raises(ConfigError, match="workers must be >= 1"):
        RayFanout(tiny_model_path, workers=0)
    with pytest.raises(ConfigError, match="model file not found"):
        RayFanout(tiny_model_path.with_name("missing.gguf"))


def test_an_address_ray_cannot_use_is_a_config_error(tiny_model_path: Path, tmp_path: Path) -> None:
    code = (
        "from swarmkv.dist import RayFanout\n"
        "from swarmkv.errors import ConfigError\n"
        "try:\n"
        f"    RayFanout({str(tiny_model_path)!r}, address='no-such-address')\n"
        "except ConfigError as e:\n"
        "    print('ConfigError:', e)\n"
    )
    out = run(python_cmd("-c", code), cwd=tmp_path, timeout=120)
    want = "ConfigError: could not start or reach the Ray cluster at 'no-such-address'"
    assert want in out.stdout, out.stdout + out.stderr[-2000:]


def test_importing_swarmkv_never_imports_ray(tmp_path: Path) -> None:
    code = (
        "import sys, swarmkv, swarmkv.cli.app, swarmkv.pipeline.builder, swarmkv.swarm\n"
        "import swarmkv.dist\n"
        "swarmkv.cli.app.build_parser()\n"
        "print('ray' in sys.modules)"
    )
    out = run(python_cmd("-c", code), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
