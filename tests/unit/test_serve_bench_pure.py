"""`swarmkv bench --serve`'s plain-Python parts: the workloads' texts and arrivals, one run's
figures, utilization, the summary over seeds and the targets (no native library, no server)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from swarmkv.errors import ConfigError
from swarmkv_bench.serve_bench import rotated
from swarmkv_bench.serve_load import Request
from swarmkv_bench.serve_report import peer_binary_lines, targets_section
from swarmkv_bench.serve_stats import add_utilization, in_flight, run_stats, summarize
from swarmkv_bench.serve_systems import STAMP_SUFFIX, binary_info, parse_stamp
from swarmkv_bench.serve_targets import keeps_up_rate, operating_rate, targets
from swarmkv_bench.serve_workloads import Shapes, Workload, arrival_times, build, varied_text


class Words:
    """A tokenizer of one token per word (BOS, id 0, first): enough to cut texts to counts."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.words: list[str] = ["<bos>"]

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        out = [0] if add_special else []
        for w in text.split(" "):
            if w and w not in self.ids:
                self.ids[w] = len(self.words)
                self.words.append(w)
            out += [self.ids[w]] if w else []
        return out

    def detokenize(self, tokens: list[int]) -> str:
        return " ".join(self.words[t] for t in tokens if t)


def words_model() -> Words:
    return Words()


SMALL = Shapes(head_tokens=40, agents=5, multiturn_agents=3, turns=2, groups=2, group_agents=3,
               group_tokens=30, cold_tokens=20, n_predict=4)  # fmt: skip


def test_every_workload_has_the_shape_it_names() -> None:
    m = words_model()
    shared, multi, groups, cold = (
        build(n, m, SMALL) for n in ("shared", "multiturn", "groups", "cold")
    )
    assert len(shared.agents) == 5 and shared.requests == 5 and len(shared.heads) == 1
    assert all(a.head == shared.heads[0] for a in shared.agents)
    assert len({a.questions for a in shared.agents}) == 5  # distinct questions
    assert multi.requests == 6 and all(len(a.questions) == 2 for a in multi.agents)
    assert len(groups.agents) == 6 and len(set(groups.heads)) == 2
    assert [a.group for a in groups.agents] == [0, 1, 0, 1, 0, 1]  # interleaved
    assert all(len(m.tokenize(h)) == 30 for h in groups.heads)
    assert cold.heads == () and len({a.head for a in cold.agents}) == 5  # nothing shared
    assert all(len(m.tokenize(a.head)) == 20 for a in cold.agents)
    with pytest.raises(ConfigError, match="unknown workload 'hot'"):
        build("hot", m, SMALL)


def test_heads_of_different_seeds_share_no_prefix() -> None:
    a, b = varied_text(0), varied_text(1)
    assert a.split(".")[0] != b.split(".")[0] and a == varied_text(0)


def test_arrivals_are_seeded_poisson_and_a_burst_is_all_at_once() -> None:
    xs = arrival_times(2000, 4.0, seed=3)
    assert xs == arrival_times(2000, 4.0, seed=3) != arrival_times(2000, 4.0, seed=4)
    assert xs == sorted(xs) and xs[-1] / 2000 == pytest.approx(0.25, rel=0.1)
    assert arrival_times(3, math.inf, seed=0) == [0.0, 0.0, 0.0]


def test_rotated_starts_each_seed_with_another_system() -> None:
    names = ["a", "b", "c"]
    assert [rotated(names, k)[0] for k in range(4)] == ["a", "b", "c", "a"]


def _req(i: int, ttft: float, done: float, text: str = "x", **kw: Any) -> Request:
    return Request(i, 0, 0, ttft_ms=ttft, done_ms=done, text=text, completion_tokens=2,
                   gaps_ms=[1.0], **kw)  # fmt: skip


def _work(agents: int = 4) -> Workload:
    return build("shared", words_model(), Shapes(head_tokens=10, agents=agents, n_predict=2))


def test_one_runs_figures() -> None:
    reqs = [_req(i, 10.0 * (i + 1), 100.0, prompt_tokens=50, cached_tokens=40) for i in range(3)]
    reqs.append(Request(3, 0, 0, error="boom"))
    alone = [_req(i, 5.0, 50.0, text="x" if i else "y") for i in range(4)]
    s = run_stats(reqs, alone, 2.0, _work(), 2.0)
    assert s["errors"] == 1 and s["tokens"] == 6 and s["tokens_per_s"] == 3.0
    assert s["offered_tokens_per_s"] == 2.0 * 2  # 2 agents/s x 1 turn x 2 tokens
    assert s["identical_to_alone"] == 2 and s["compared"] == 3  # agent 0's alone differs
    assert s["prompt_tokens_computed"] == 30 and s["prompt_tokens_reused"] == 120
    assert s["queue_ms"]["p50"] == pytest.approx(15.0)  # 20 less its 5 alone
    assert s["jain_slowdown"] == pytest.approx(1.0)  # every one slowed 2x: fair
    assert run_stats(reqs, alone, 2.0, _work(), math.inf)["offered_tokens_per_s"] is None


def test_a_server_without_cached_tokens_leaves_the_split_unknown() -> None:
    reqs = [_req(0, 1.0, 2.0, prompt_tokens=50)]
    s = run_stats(reqs, reqs, 1.0, _work(1), 1.0)
    assert s["prompt_tokens_computed"] is None and s["prompt_tokens_reused"] is None


def test_in_flight_is_the_time_weighted_count_of_open_requests() -> None:
    # sent at 0, 1 and 1 s; answered after 2, 2 and 1 s: open 1 for [0,1), 3 for [1,2),
    # 1 for [2,3) -> mean 5/3 over the 3 s span, at most 3
    reqs = [Request(i, 0, 0, sent_s=t, done_ms=d) for i, (t, d) in
            enumerate(((0.0, 2000.0), (1.0, 2000.0), (1.0, 1000.0)))]  # fmt: skip
    assert in_flight(reqs) == {"mean": pytest.approx(5 / 3), "max": 3.0}
    assert in_flight([Request(0, 0, 0)]) == {"mean": 0.0, "max": 0.0}  # none answered


def _run(
    system: str, rate: Any, seed: int, tps: float, p99: float, live: float, **kw: Any
) -> dict[str, Any]:
    offered = None if rate == "burst" else rate * 10
    return {
        "system": system, "kernels": "exact", "rate": rate, "seed": seed, "tokens_per_s": tps,
        "offered_tokens_per_s": offered, "ttft_ms": {"p50": p99 / 2, "p95": p99, "p99": p99},
        "itl_ms": {"p50": 1, "p95": 1, "p99": 1}, "done_ms": {"p50": 1, "p95": 1, "p99": 1},
        "queue_ms": {"p50": 1, "p95": 1, "p99": 1}, "jain_slowdown": 0.9, "errors": 0,
        "identical_to_alone": 4, "compared": 4, "in_flight": {"mean": live, "max": live},
        "prompt_tokens_computed": kw.get("computed"), "prompt_tokens_reused": 0,
        "peak_rss_bytes": 2**20,
    }  # fmt: skip


def test_utilization_is_offered_over_the_most_the_system_reached() -> None:
    runs = [_run("swarmkv", 1.0, 0, 10.0, 100, 2), _run("swarmkv", 4.0, 0, 30.0, 200, 12),
            _run("swarmkv", "burst", 0, 50.0, 900, 30)]  # fmt: skip
    add_utilization(runs)
    assert [r["utilization"] for r in runs] == [0.2, 0.8, None]
    assert [r["past_capacity"] for r in runs] == [False, False, None]
    assert all(r["capacity_tokens_per_s"] == 50.0 for r in runs)


def test_the_best_burst_is_every_seeds_capacity() -> None:
    # a seed's rate must not be its own capacity: the best burst of any seed is every seed's
    runs = [_run("swarmkv", 1.0, seed, 16.0, 100, 2) for seed in (0, 1, 2)]
    runs += [_run("swarmkv", "burst", seed, tps, 900, 8) for seed, tps in ((0, 96.0), (1, 128.0))]
    add_utilization(runs)
    assert [r["utilization"] for r in runs[:3]] == [10 / 128] * 3  # offered: rate x 10
    assert all(r["capacity_tokens_per_s"] == 128.0 for r in runs)


def _workload(runs: list[dict[str, Any]]) -> dict[str, Any]:
    add_utilization(runs)
    rates = list(dict.fromkeys(r["rate"] for r in runs))
    by_rate = [
        {"rate": x, "summary": summarize([r for r in runs if r["rate"] == x])} for x in rates
    ]
    return {"runs": runs, "by_rate": by_rate}


def test_targets_judge_the_operating_rate_and_the_worst_seed() -> None:
    runs = []
    for seed, peer_p99 in ((0, 1000.0), (1, 400.0)):
        runs += [_run("swarmkv", 1.0, seed, 10.0, 50, 3),
                 _run("server-np1", 1.0, seed, 10.0, 60, 3),
                 _run("swarmkv", 4.0, seed, 40.0, 100, 12),
                 _run("server-np1", 4.0, seed, 20.0, peer_p99, 40),
                 _run("swarmkv", "burst", seed, 60.0, 300, 30),
                 _run("server-np1", "burst", seed, 20.0, 3000, 40)]  # fmt: skip
    work = _workload(runs)
    assert operating_rate(work, "exact") == 4.0  # 12 live; burst is never the operating rate
    assert keeps_up_rate(work, "exact") == 1.0  # at 4/s server-np1 is past its 20 tok/s
    got = {(t["at"], t["target"][:8]): t for t in targets({"shared": work}, ["exact"])}
    ttft = got[("operating", "p99 TTFT")]
    assert ttft["per_seed"] == [10.0, 4.0] and ttft["pass"] is False  # seed 1 fails 5x
    assert got[("operating", "tokens/s")]["per_seed"] == [2.0, 2.0]
    assert got[("operating", "tokens/s")]["pass"] is True
    assert got[("keeps-up", "p99 TTFT")]["per_seed"] == [pytest.approx(1.2)] * 2
    summary = work["by_rate"][1]["summary"]["server-np1/exact"]
    assert summary["ttft_p99_ms"] == [700.0, 400.0, 1000.0] and summary["past_capacity"] == [
        True,
        True,
    ]


def test_multiturn_target_is_computed_prompt_tokens_against_server_np16() -> None:
    runs = [_run("swarmkv", 1.0, 0, 10.0, 50, 3, computed=100),
            _run("server-np16", 1.0, 0, 10.0, 50, 3, computed=1000)]  # fmt: skip
    (t,) = targets({"multiturn": _workload(runs)}, ["exact"])
    assert t["per_seed"] == [0.1] and t["pass"] is True and t["goal"] == "<= 0.2"


def _log(texts: list[str]) -> list[dict[str, Any]]:
    return [{"agent": i, "turn": 0, "text": t, "error": None} for i, t in enumerate(texts)]


def test_ray_replicas_are_judged_against_one_server_and_never_as_a_peer() -> None:
    """swarmkv-ray2 (bench --serve --ray): its tokens/s over one swarmkv serve's (>= 0.9) and
    its answers the same, per seed; it never stands in for a llama-server peer."""
    runs = []
    for seed, ray_tps in ((0, 9.5), (1, 8.0)):
        mine = _run("swarmkv", 1.0, seed, 10.0, 50, 3) | {"requests_log": _log(["a", "b"])}
        ray = _run("swarmkv-ray2", 1.0, seed, ray_tps, 1, 3)
        ray["requests_log"] = _log(["a", "b" if seed == 0 else "c"])
        runs += [mine, ray, _run("server-np1", 1.0, seed, 5.0, 500, 3)]
    got = {t["target"]: t for t in targets({"groups": _workload(runs)}, ["exact"])}
    tps = got["tokens/s, swarmkv-ray2 over swarmkv"]
    assert tps["per_seed"] == [0.95, 0.8] and tps["pass"] is False  # seed 1 is below 0.9
    same = got["answers of swarmkv-ray2 equal to swarmkv's"]
    assert same["per_seed"] == [1.0, 0.5] and same["pass"] is False
    shared = targets({"shared": _workload([dict(r) for r in runs])}, ["exact"])
    ttft = next(t for t in shared if t["target"].startswith("p99 TTFT"))
    assert ttft["per_seed"] == [10.0, 10.0]  # against server-np1, not the ray's 1 ms


def test_a_burst_runs_at_every_seed_like_a_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    from swarmkv_bench import serve_bench

    calls: list[tuple[str, Any, int]] = []

    def fake_run(name: str, setup: Any, work: Any, size: Any, rate: float, seed: int) -> dict:
        calls.append((name, rate, seed))
        label = serve_bench.rate_label(rate)
        return _run(name, label, seed, 10.0, 50, 3) | {"workload": work.name}

    monkeypatch.setattr(serve_bench, "one_run", fake_run)
    from swarmkv_bench.serve_systems import Sizes

    monkeypatch.setattr(serve_bench, "sizes", lambda work, model: Sizes(1, 2, 1))
    opts = serve_bench.ServeBenchOptions(
        model=Path("m.gguf"), head="h", head_tokens=1, rates=(1.0, math.inf), seeds=(0, 1, 2),
        peers=(), kernels=("exact",), ray=True,
    )  # fmt: skip
    serve_bench.run_workload(opts, _work(2), None)
    assert [c for c in calls if c[1] == 1.0] == [
        (n, 1.0, s) for s, ns in ((0, ("swarmkv", "swarmkv-ray2")),
                                  (1, ("swarmkv-ray2", "swarmkv")),
                                  (2, ("swarmkv", "swarmkv-ray2"))) for n in ns
    ]  # fmt: skip
    # a burst repeats per seed: a server's queue takes simultaneous requests in another order
    # each run (the systems' order rotates as at a rate)
    assert [c for c in calls if c[1] == math.inf] == [
        (n, math.inf, s) for s, ns in ((0, ("swarmkv", "swarmkv-ray2")),
                                       (1, ("swarmkv-ray2", "swarmkv")),
                                       (2, ("swarmkv", "swarmkv-ray2"))) for n in ns
    ]  # fmt: skip


def test_the_restored_peer_saves_each_head_once_and_restores_the_rest() -> None:
    from swarmkv_bench.slot_restore import plan, slot_dir_of

    assert plan(1, 4) == [(1, 0), (2, 0), (3, 0)]
    assert plan(2, 5) == [(2, 0), (3, 1), (4, 0)]  # round robin: heads 0,1 own slots 0,1
    assert plan(3, 3) == []
    with pytest.raises(ValueError, match="cannot each have a slot"):
        plan(5, 4)
    assert slot_dir_of(["-x", "--slot-save-path", "/tmp/s"]) == Path("/tmp/s")
    with pytest.raises(ValueError, match="no --slot-save-path"):
        slot_dir_of(["--slot-save-path"])


class _FakeServer:
    """LlamaServer's context-manager surface, holding its config; never starts a process."""

    def __init__(self, binary: Path, config: Any) -> None:
        self.config = config

    def __enter__(self) -> _FakeServer:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def test_the_restored_peers_save_folder_lives_exactly_as_long_as_its_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from swarmkv_bench import serve_systems
    from swarmkv_bench.serve_systems import Setup, Sizes, open_system, peer_config
    from swarmkv_bench.slot_restore import slot_dir_of

    monkeypatch.setattr(serve_systems, "LlamaServer", _FakeServer)
    setup = Setup(Path("m.gguf"), 2, "exact", Path("llama-server"))
    size = Sizes(8, 16, 8)
    with open_system("server-np16-restore", setup, _work(), size) as server:
        folder = slot_dir_of(server.config.extra_args)
        assert folder.is_dir()
    assert not folder.exists()  # a cold workload never restores: the folder goes all the same
    with (
        pytest.raises(RuntimeError, match="boom"),
        open_system("server-np16-restore", setup, _work(), size) as server,
    ):
        folder = slot_dir_of(server.config.extra_args)
        raise RuntimeError("boom")
    assert not folder.exists()
    with open_system("server-np16", setup, _work(), size) as server:
        assert "--slot-save-path" not in server.config.extra_args
        assert "--no-cache-idle-slots" not in server.config.extra_args
    with open_system("server-np16-unified", setup, _work(), size) as server:
        # keeps its idle slots' prompts: cleared into the prompt cache, a head moves into one
        # slot and every other request of a burst computes it again
        assert server.config.extra_args == ("--no-cache-idle-slots",)
    with pytest.raises(ValueError, match="needs a folder"):
        peer_config("server-np16-restore", setup, _work(), 16)


def test_a_run_with_no_target_says_so_instead_of_an_empty_block() -> None:
    assert targets_section([]) == [
        "## Targets",
        "",
        "No target applies to the workloads of this run.",
        "",
    ]
    judged = {
        "pass": False,
        "spread": [1.08, 1.03, 1.21],
        "workload": "shared",
        "kernels": "exact",
        "rate": 6.0,
        "at": "operating",
        "target": "tokens/s, swarmkv over best peer",
        "goal": ">= 1.5",
    }
    body = targets_section([judged])[2:-1]
    assert body[0] == body[-1] == "```" and "FAIL" in body[1] and "1.08 [1.03-1.21]" in body[1]


STAMP = (
    "llama-cpp-python==0.3.36 832db069 0c1e5709 "
    "0001-llama-keep-a-sequence.patch:188901d0785686b3,0012-server-keep.patch:9ce0505fa8600743\n"
)


def test_a_peer_binary_names_the_patches_its_tree_was_stamped_with(tmp_path: Path) -> None:
    # a stand-in for llama-server: answers --version like it, stamped as the build script does
    binary = tmp_path / "bin" / "llama-server"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\necho 'version: 1 (build 2, commit 0c1e5709)'\necho built\n")
    binary.chmod(0o755)
    assert binary_info(binary)["tree"] is None  # built another way: patches unknown
    assert "unknown" in peer_binary_lines(binary_info(binary))[0]
    Path(str(binary) + STAMP_SUFFIX).write_text(STAMP)
    info = binary_info(binary)
    assert info["tree"] == {
        "source": "llama-cpp-python==0.3.36",
        "commit": "0c1e5709",
        "patches": [  # as stamped, with each patch's hash, like the library's build info
            "0001-llama-keep-a-sequence.patch:188901d0785686b3",
            "0012-server-keep.patch:9ce0505fa8600743",
        ],
    }
    assert peer_binary_lines(info)[0].endswith("commit: 0c1e5709, patches: 0001, 0012")
    assert peer_binary_lines(None) == []  # no peer in the run


def _library(commit: str, patches: list[str]) -> dict[str, object]:
    return {"llama_cpp_commit": commit, "patches": patches}


def test_a_peer_line_says_whether_the_peers_tree_is_the_librarys() -> None:
    tree = parse_stamp(STAMP)
    info = {"binary": "llama-server", "tree": tree}
    same = peer_binary_lines(info, _library("0c1e5709", list(tree["patches"])))[0]
    assert same.endswith("patches: 0001, 0012; the same tree as SwarmKV's library")
    changed = [tree["patches"][0], "0012-server-keep.patch:0000000000000000"]  # edited since
    line = peer_binary_lines(info, _library("0c1e5709", changed))[0]
    assert line.endswith(
        "by name, 1 with another file hash (edited, or renumbered when a patch was added)"
    )
    fewer = peer_binary_lines(info, _library("0c1e5709", tree["patches"][:1]))[0]
    assert fewer.endswith("(only the peers': 0012; only the library's: none)")
    renumbered = ["0001-llama-keep-a-sequence.patch:1111111111111111"]  # 0012 added since
    line = peer_binary_lines(info, _library("0c1e5709", renumbered))[0]
    assert line.endswith("(only the peers': 0012; only the library's: none)")
    other = peer_binary_lines(info, _library("ffffffff", list(tree["patches"])))[0]
    assert other.endswith("another llama.cpp commit than SwarmKV's library (ffffffff)")


def test_a_peer_stamped_by_name_only_compares_by_name() -> None:
    # results written before stamps kept hashes hold names only: compared by name, and said so
    tree = {"commit": "0c1e5709", "patches": ["0001-a.patch", "0012-b.patch"]}
    library = _library("0c1e5709", ["0001-a.patch:11", "0012-b.patch:22"])
    line = peer_binary_lines({"binary": "x", "tree": tree}, library)[0]
    assert line.endswith("the same tree as SwarmKV's library (patch names)")


def test_a_stamp_without_patches_and_a_file_that_is_no_stamp() -> None:
    assert parse_stamp("llama-cpp-python==0.3.36 832db069 0c1e5709\n")["patches"] == []
    with pytest.raises(ValueError, match="not a tree stamp"):
        parse_stamp("hello world")
