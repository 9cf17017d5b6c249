"""The test tiers, as declared: plain `pytest` (the fast tier, pyproject's addopts) and
`.ci/run`'s slow-tier command line together select every collected test, each exactly once;
the fast tier holds the real-model smoke set, and the slow tier holds the loops and runs the
tiers issue names (fuzz, leaks, kills, Ray, llama-server peers, many branches, examples,
benchmark runs).

The marker expressions are read from where they are used (pyproject.toml and .ci/run), so a
change to either is checked, and they are evaluated the way `pytest -m` evaluates them."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest
from _pytest.mark import MarkMatcher  # pytest's own `-m` matcher: the same rules as -m
from _pytest.mark.expression import Expression

from support.tiers import COLLECTED

REPO = Path(__file__).resolve().parents[2]

# The fast tier's real-model smoke set (the tiers issue): one fork run bit-identical to the
# baseline, one snapshot round trip, one swarm run, one CLI run.
FAST_SMOKE = (
    "tests/model/test_batch_invariant.py::test_fork_equals_the_baseline_bit_for_bit"
    "[smoke-4-branches]",
    "tests/model/test_snapshot_real.py::test_snapshot_file_round_trip_restores_exactly",
    "tests/model/test_swarm_real.py::test_poisson_arrivals_answer_exactly[fair]",
    "tests/model/test_cli_real.py::test_run_json_in_every_mode[fork]",
)
# Files whose every test belongs to the slow tier.
SLOW_FILES = (
    "tests/native/test_snapshot_fuzz.py",  # fuzz
    "tests/native/test_snapshot_leaks.py",  # leak loops
    "tests/native/test_resources.py",
    "tests/native/test_snapshot_kill.py",  # kill loops
    "tests/model/test_teardown_real.py",
    "tests/native/test_ray_tiny.py",  # Ray
    "tests/model/test_ray_real.py",
    "tests/native/test_serve_ray_tiny.py",
    "tests/native/test_serve_ray_cli.py",
    "tests/native/test_peer_smoke.py",  # llama-server peers
    "tests/model/test_peer_invariant_real.py",
    "tests/model/test_swarm_peers_real.py",
    "tests/model/test_many_branches.py",  # many branches
    "tests/model/test_examples.py",  # example scripts
    "tests/model/test_bench_memory.py",  # benchmark smoke runs
    "tests/model/test_bench_snapshot_modes.py",
    "tests/model/test_bench_swarm.py",
    "tests/model/test_profile_step.py",
)


def fast_expression() -> str:
    """The `-m` expression plain `pytest` runs with (pyproject's addopts)."""
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    addopts = cfg["addopts"]
    args = shlex.split(addopts) if isinstance(addopts, str) else list(addopts)
    return args[args.index("-m") + 1]


def ci_slow_expressions() -> list[str]:
    """The `-m` expressions of the pytest runs in .ci/run besides the README's plain one."""
    found = []
    for line in (REPO / ".ci" / "run").read_text().splitlines():
        line = line.split("#", 1)[0]
        if re.search(r"(^|\s)pytest\s", line) and " -m " in line:
            args = shlex.split(line[line.index("pytest") :])
            found.append(args[args.index("-m") + 1])
    return found


def selects(expression: str, item: pytest.Item) -> bool:
    return Expression.compile(expression).evaluate(MarkMatcher.from_markers(item.iter_markers()))


@pytest.fixture(scope="module")
def collected(request: pytest.FixtureRequest) -> list[pytest.Item]:
    items = request.config.stash.get(COLLECTED, [])
    files = {REPO / i.nodeid.split("::")[0] for i in items}
    every = set((REPO / "tests").rglob("test_*.py"))
    if not every <= files:
        pytest.skip("the tiers are checked when the whole suite is collected (plain `pytest`)")
    return items


def test_ci_runs_the_slow_tier_after_the_readme_command() -> None:
    assert ci_slow_expressions(), ".ci/run has no `pytest -m ...` line for the slow tier"
    assert fast_expression() == "not slow"


def test_the_tiers_together_select_every_collected_test_once(
    collected: list[pytest.Item],
) -> None:
    fast, slow = fast_expression(), ci_slow_expressions()
    missed, twice = [], []
    for item in collected:
        hits = [selects(fast, item), *(selects(e, item) for e in slow)]
        if not any(hits):
            missed.append(item.nodeid)
        elif sum(hits) > 1:
            twice.append(item.nodeid)
    assert not missed, f"in no tier: {missed[:20]}"
    assert not twice, f"in more than one tier: {twice[:20]}"


def test_the_fast_tier_holds_the_real_model_smoke_set(collected: list[pytest.Item]) -> None:
    by_id = {i.nodeid: i for i in collected}
    for nodeid in FAST_SMOKE:
        assert nodeid in by_id, f"{nodeid} is not collected"
        assert selects(fast_expression(), by_id[nodeid]), f"{nodeid} is not in the fast tier"


def test_the_slow_tier_holds_the_loops_and_runs(collected: list[pytest.Item]) -> None:
    fast = fast_expression()
    for path in SLOW_FILES:
        items = [i for i in collected if i.nodeid.split("::")[0] == path]
        assert items, f"{path}: nothing collected"
        in_fast = [i.nodeid for i in items if selects(fast, i)]
        assert not in_fast, f"in the fast tier: {in_fast}"
