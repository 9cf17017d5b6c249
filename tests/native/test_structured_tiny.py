"""Constrained branches on the tiny model in every handoff mode, in the Swarm, from a TOML
file through `swarmkv run`, and on Ray workers: every output matches its constraint, and
every mode decodes the baseline's tokens (the mask is per row, so exactness holds)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from swarmkv import Constraint, Model, Pipeline, Swarm
from swarmkv.errors import ConfigError
from swarmkv.pipeline.modes import MODES

from support.proc import run, swarmkv_cmd

DOC = "The committee met on the fifth of May and approved four of the seven requests. " * 4
SCHEMA = {
    "type": "object",
    "properties": {
        "approved": {"type": "integer", "minimum": 0, "maximum": 9},
        "verdict": {"enum": ["yes", "no"]},
        "when": {"type": "string", "pattern": "^[0-9]{2}/[0-9]{2}$"},
    },
    "required": ["approved", "verdict", "when"],
    "additionalProperties": False,
}
BRANCHES = {
    "json": Constraint.json_schema(SCHEMA),
    "regex": Constraint.regex(r"[A-Z][a-z]{2,5} [0-9]{1,2}"),
    "choice": Constraint.choice(["approved", "rejected", "deferred"]),
    "lark": Constraint.grammar('start: "n=" NUM\nNUM: /[1-9][0-9]?/'),
    "gbnf": Constraint.gbnf('root ::= "n=" [1-9] [0-9]?'),
    "object": Constraint.json_object(),
}


def _check(name: str, text: str, stop: str) -> None:
    if stop in ("truncated", "length"):
        return  # cut at n_predict before the grammar completed: reported, never "done"
    # llguidance stops a complete grammar ("grammar"); llama.cpp's GBNF sampler then allows
    # only an end-of-generation token ("eog")
    assert stop == ("eog" if name == "gbnf" else "grammar"), (name, stop)
    if name == "json":
        jsonschema.validate(json.loads(text), SCHEMA)
    elif name == "object":
        assert isinstance(json.loads(text), dict)
    elif name == "regex":
        assert re.fullmatch(r"[A-Z][a-z]{2,5} [0-9]{1,2}", text), text
    elif name == "choice":
        assert text in ("approved", "rejected", "deferred"), text
    else:
        assert re.fullmatch(r"n=[1-9][0-9]?", text), text


def _pipeline(model: Model, temperature: float) -> Pipeline:
    p = Pipeline(model, n_threads=1).prefill("doc", text=DOC)
    for i, (name, c) in enumerate(BRANCHES.items()):
        p.branch(name, prompt=f" Answer {i}:", n_predict=40, temperature=temperature, seed=i,
                 constraint=c)  # fmt: skip
    return p


@pytest.mark.parametrize("temperature", [0.0, 1.3])
def test_every_mode_decodes_the_constrained_baseline(tiny_model: Model, temperature: float) -> None:
    with _pipeline(tiny_model, temperature) as p:
        runs = {mode: p.run(mode) for mode in MODES}
    base = runs["baseline"]
    done = 0
    for name, b in base.branches.items():
        _check(name, b.text, b.stop_reason)
        done += b.stop_reason in ("grammar", "eog")
    assert done >= len(BRANCHES) - 1, {n: b.stop_reason for n, b in base.branches.items()}
    assert base["json"].forced_tokens > 0 and base["gbnf"].forced_tokens == 0
    for mode, got in runs.items():
        for name, b in base.branches.items():
            assert got[name].tokens == b.tokens, (mode, name)
            assert got[name].stop_reason == b.stop_reason, (mode, name)


def test_the_swarm_takes_constraints(tiny_model: Model) -> None:
    with _pipeline(tiny_model, 0.0) as p:
        base = p.run("baseline")
    with Swarm(tiny_model, n_ctx=2048, max_live=3, n_threads=1) as sw:
        sw.add_document("doc", text=DOC)
        handles = {
            name: sw.submit("doc", f" Answer {i}:", n_predict=40, seed=i, constraint=c)
            for i, (name, c) in enumerate(BRANCHES.items())
        }
        results = {name: h.result(60) for name, h in handles.items()}
        with pytest.raises(ConfigError, match=r"gbnf: llama\.cpp cannot parse"):
            sw.submit("doc", " X", constraint=Constraint.gbnf("root ::= [0-9"))
        with pytest.raises(ConfigError, match="choice: the list of strings is empty"):
            sw.submit("doc", " X", constraint=Constraint.choice([]))
    for name, r in results.items():
        assert r.tokens == base[name].tokens, name
        assert r.stop_reason == base[name].stop_reason, name


def test_a_toml_pipeline_with_constraints_runs(tiny_model_path: Path, tmp_path: Path) -> None:
    (tmp_path / "schema.json").write_text(json.dumps(SCHEMA), encoding="utf-8")
    (tmp_path / "p.toml").write_text(
        f'[settings]\nmodel = "{tiny_model_path}"\nthreads = 1\nn_predict = 40\n'
        'choice = ["approved", "rejected"]\n'
        f'[document]\ntext = "{DOC}"\n'
        '[[branch]]\nname = "json"\nprompt = " A:"\njson_schema_file = "schema.json"\n'
        '[[branch]]\nname = "choice"\nprompt = " B:"\n',
        encoding="utf-8",
    )
    out = run(swarmkv_cmd("run", str(tmp_path / "p.toml"), "--json"), cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    branches = {b["name"]: b for b in json.loads(out.stdout)["branches"]}
    _check("json", branches["json"]["text"], branches["json"]["stop_reason"])
    assert branches["choice"]["text"] in ("approved", "rejected")
    argv = ["-m", str(tiny_model_path), "--doc", str(tmp_path / "p.toml"), "--branch", "x"]
    flags = run(swarmkv_cmd("run", *argv, "--regex", "("), cwd=tmp_path, timeout=60)
    assert flags.returncode == 2 and "regex: " in flags.stderr, flags.stderr


@pytest.mark.slow
def test_ray_workers_apply_the_constraints(tiny_model: Model, tiny_model_path: Path) -> None:
    ray = pytest.importorskip("ray", reason="the [test] extra installs ray")
    from swarmkv.dist import RayFanout

    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        with _pipeline(tiny_model, 1.3) as p, RayFanout(tiny_model_path, workers=2, threads=1) as f:
            local = p.run("fork")
            got = f.run(p, "fork")
    finally:
        ray.shutdown()
    for name, b in local.branches.items():
        assert got[name].tokens == b.tokens, name
        assert got[name].stop_reason == b.stop_reason, name
