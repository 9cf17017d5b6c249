"""The prefix-affinity router's choice and its record of what went where (swarmkv.dist.affinity
and prefix_record): pure Python, no Ray, no native library. Also the `--ray-replicas` flags
that are refused before anything starts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmkv.cli.app import main
from swarmkv.dist.affinity import AffinityConfig, choose
from swarmkv.dist.claims import Claims
from swarmkv.dist.prefix_record import PrefixRecord
from swarmkv.errors import ConfigError

HEAD = list(range(100, 160))  # 60 tokens: a shared head, well over min_match_tokens
CFG = AffinityConfig(max_imbalance=4, min_match_tokens=16, max_tokens_per_replica=10_000)


def pick(record: PrefixRecord, tokens: list[int], loads: dict[str, int]) -> str:
    return choose(loads, record.match(tokens), record.sizes, CFG)[0]


def test_the_longest_prefix_wins_over_load() -> None:
    rec = PrefixRecord(10_000)
    rec.insert("a", [*HEAD, 1, 2, 3])
    rec.insert("b", [*HEAD[:30], *range(7, 27)])
    assert rec.match([*HEAD, 1, 9]) == {"a": 61, "b": 30}
    # b holds a shorter prefix and is idle; a, with the longest, is busier but within the bound
    assert pick(rec, [*HEAD, 1, 9], {"a": 3, "b": 0}) == "a"
    assert pick(rec, [*HEAD[:30], *range(7, 27), 1], {"a": 0, "b": 3}) == "b"  # 50 against 30


def test_a_few_more_matched_tokens_do_not_outweigh_load() -> None:
    """Both replicas hold the head (warmed); a holds a question's first words too: the burst
    must not pile onto a for those (it did: 5 of 8, 10 of 16)."""
    rec = PrefixRecord(10_000)
    rec.insert("a", [*HEAD, 1, 2, 3])
    rec.insert("b", HEAD)
    assert rec.match([*HEAD, 1, 2, 9]) == {"a": 62, "b": 60}
    assert pick(rec, [*HEAD, 1, 2, 9], {"a": 1, "b": 0}) == "b"
    assert pick(rec, [*HEAD, 1, 2, 9], {"a": 0, "b": 0}) == "a"  # the longer match breaks a tie
    # a burst of 16 over two warmed replicas, each choice counted as load at once: 8 and 8
    loads = {"a": 0, "b": 0}
    for q in range(16):
        tokens = [*HEAD, 1, 2, 100 + q]
        r = pick(rec, tokens, loads)
        rec.insert(r, tokens)
        loads[r] += 1
    assert loads == {"a": 8, "b": 8}


def test_a_tie_on_the_prefix_is_broken_by_load() -> None:
    rec = PrefixRecord(10_000)
    for r in ("a", "b", "c"):
        rec.insert(r, [*HEAD, 5])
    assert pick(rec, [*HEAD, 6], {"a": 3, "b": 1, "c": 2}) == "b"
    order = choose({"a": 3, "b": 1, "c": 2}, rec.match([*HEAD, 6]), rec.sizes, CFG)
    assert order == ["b", "c", "a"]  # every replica, best first: Serve's fallback ranks


def test_the_imbalance_bound_sends_to_the_least_loaded() -> None:
    rec = PrefixRecord(10_000)
    rec.insert("a", HEAD)
    rec.insert("c", HEAD[:20])
    # a is 4 requests busier than the least loaded: at the bound, affinity still holds
    assert pick(rec, HEAD, {"a": 5, "b": 1, "c": 1}) == "a"
    # 5 more: past it; the least loaded wins, the longer match (c's) breaking their tie
    assert pick(rec, HEAD, {"a": 6, "b": 1, "c": 1}) == "c"
    strict = AffinityConfig(max_imbalance=0)
    assert choose({"a": 1, "b": 0}, rec.match(HEAD), rec.sizes, strict)[0] == "b"


def test_a_short_common_start_is_no_affinity() -> None:
    rec = PrefixRecord(10_000)
    rec.insert("a", [1, 2, 3, 4, 5, *HEAD])  # shares only a BOS-like start with what follows
    rec.insert("b", [9, 9])
    assert rec.match([1, 2, 3, 4, 5, 77, 78]) == {"a": 5}
    assert pick(rec, [1, 2, 3, 4, 5, 77, 78], {"a": 1, "b": 0}) == "b"


def test_new_prefixes_spread_over_idle_replicas() -> None:
    rec = PrefixRecord(10_000)
    loads = {"a": 0, "b": 0}
    # every prompt starts with BOS: a match that short must not outweigh the smaller record
    heads = [[1, *(h * 1000 + i for i in range(40))] for h in range(4)]
    placed = {}
    for h, head in enumerate(heads):
        placed[h] = pick(rec, head, loads)
        rec.insert(placed[h], head)
    assert sorted(placed.values()) == ["a", "a", "b", "b"]  # the smaller record takes the next
    for h, head in enumerate(heads):  # and each head keeps its replica
        assert pick(rec, [*head, 1, 2], loads) == placed[h]


def test_a_dead_replica_is_forgotten() -> None:
    rec = PrefixRecord(10_000)
    rec.insert("a", [*HEAD, 1])
    rec.insert("b", [*HEAD, 2])
    rec.insert("a", [50, 51, 52])
    rec.drop("a")
    assert rec.replicas == ["b"]
    assert rec.match([*HEAD, 1]) == {"b": 60}
    assert rec.match([50, 51, 52]) == {}
    assert rec.total_tokens() == rec.sizes["b"] == 61  # a's own runs are cut off
    assert pick(rec, [*HEAD, 1], {"b": 3, "c": 0}) == "b"  # b is the one that holds it now
    rec.drop("a")  # twice: nothing more to do


def test_the_record_stays_within_its_budget_least_recent_first() -> None:
    rec = PrefixRecord(1000)
    prompts = [[p, *range(1000 + p * 100, 1000 + p * 100 + 99)] for p in range(30)]  # 100 each
    for p in prompts:
        rec.insert("a", p)
        rec.insert("b", p[:50])
        assert rec.sizes["a"] <= 1000 and rec.sizes["b"] <= 1000
    assert rec.total_tokens() <= 2 * 1000
    assert rec.match(prompts[-1])["a"] == 100  # the most recent is whole
    assert "a" not in rec.match(prompts[0])  # the oldest went first
    rec.insert("a", prompts[-5])  # sending one again makes it the most recent
    for p in prompts[:8]:
        rec.insert("c", p)
    assert rec.match(prompts[-5])["a"] == 100


def test_a_request_over_the_whole_budget_leaves_the_record_bounded() -> None:
    rec = PrefixRecord(50)
    rec.insert("a", list(range(200)))
    assert rec.sizes["a"] <= 50 and rec.total_tokens() <= 50


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c"]),
            st.lists(st.integers(0, 3), min_size=1, max_size=12),
        ),
        max_size=25,
    ),
    st.lists(st.integers(0, 3), min_size=1, max_size=12),
)
def test_match_equals_the_longest_common_prefix_of_what_was_sent(
    sent: list[tuple[str, list[int]]], query: list[int]
) -> None:
    """Against a brute-force record (no eviction: the budget is never reached)."""
    rec = PrefixRecord(10_000)
    for replica, tokens in sent:
        rec.insert(replica, tokens)

    def common(a: list[int], b: list[int]) -> int:
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    want: dict[str, int] = {}
    for replica, tokens in sent:
        n = common(tokens, query)
        if n:
            want[replica] = max(want.get(replica, 0), n)
    assert rec.match(query) == want
    for replica in {r for r, _ in sent}:  # sizes: the distinct prefixes' tokens, per replica
        prefixes = {tuple(t[:i]) for r, t in sent if r == replica for i in range(1, len(t) + 1)}
        assert rec.sizes[replica] == len(prefixes)


def test_bad_router_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="max_imbalance must be >= 0, got -1"):
        AffinityConfig(max_imbalance=-1).check()
    with pytest.raises(ConfigError, match="budget must be >= 1 token, got 0"):
        PrefixRecord(0)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--ray-replicas", "0"], "--ray-replicas must be >= 1, got 0"),
        (["--address", "auto"], "--address needs --ray-replicas"),
        (["--routing", "round-robin"], "--routing needs --ray-replicas"),
        (["--max-imbalance", "2"], "--max-imbalance needs --ray-replicas"),
        (["--ray-replicas", "2", "--max-imbalance", "-1"], "--max-imbalance must be >= 0, got -1"),
    ],
)
def test_ray_flags_are_checked_before_anything_starts(
    capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    # a model path that does not exist: a check after a model load would name that instead
    code = main(["serve", "-m", "/nonexistent/model.gguf", *flags])
    assert code == 2
    assert message in capsys.readouterr().err


def test_claims_count_until_placed_or_lapsed() -> None:
    claims = Claims(ttl_s=10.0)
    claims.claim("q1", "a", now=0.0)
    claims.claim("q2", "a", now=1.0)
    claims.claim("q3", "b", now=2.0)
    assert claims.counts(now=3.0) == {"a": 2, "b": 1}
    claims.placed("q1")  # Serve's own count has it now
    claims.claim("q2", "b", now=4.0)  # chosen again (its first replica was full): moves
    assert claims.counts(now=5.0) == {"b": 2}
    claims.placed("never-claimed")  # a call Serve placed without a claim: nothing happens
    assert claims.counts(now=12.5) == {"b": 1}  # q3 (at 2.0) lapsed; q2 (at 4.0) not yet
    claims.drop_replica("b")
    assert claims.counts(now=12.5) == {}


def test_a_burst_on_a_shared_head_spreads_over_the_replicas_that_hold_it() -> None:
    """Serve's queue lengths read 0 for every choice of a burst (none is sent yet): the claims
    make each choice see the ones before it, so the burst alternates instead of piling up."""
    rec, claims = PrefixRecord(10_000), Claims()
    for r in ("a", "b"):
        rec.insert(r, HEAD)  # both warmed
    picks = []
    for i in range(8):
        tokens = [*HEAD, 1000 + i]
        loads = {"a": 0, "b": 0}
        for r, n in claims.counts(now=0.0).items():
            loads[r] += n
        pick = choose(loads, rec.match(tokens), rec.sizes, CFG)[0]
        rec.insert(pick, tokens)
        claims.claim(f"q{i}", pick, now=0.0)
        picks.append(pick)
    assert picks.count("a") == picks.count("b") == 4, picks
