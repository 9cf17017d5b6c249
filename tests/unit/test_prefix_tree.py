"""The server's radix tree and prefix cache, against a fake context: matching, sharing,
cell accounting, eviction order and tenant scopes (no native library)."""

from __future__ import annotations

import random

import pytest

from swarmkv.serve.kv_cache import PrefixCache
from swarmkv.serve.prefix_tree import PrefixTree


class FakeCtx:
    """Cells per sequence as position sets, like llama.cpp's seq_cp/seq_rm on one stream."""

    def __init__(self) -> None:
        self.seqs: dict[int, set[int]] = {}
        self.calls: list[tuple] = []

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        self.calls.append(("cp", src, dst, p0, p1))
        self.seqs.setdefault(dst, set()).update(
            p for p in self.seqs.get(src, set()) if p0 <= p < p1
        )

    def seq_rm(self, seq: int, p0: int | None = None, p1: int | None = None) -> None:
        if p0 is None and p1 is None:
            self.calls.append(("rm", seq))
            self.seqs.pop(seq, None)
            return
        self.calls.append(("rm", seq, p0, p1))
        lo, hi = p0 or 0, float("inf") if p1 is None else p1
        self.seqs[seq] = {p for p in self.seqs.get(seq, set()) if not lo <= p < hi}

    def decode(self, seq: int, n: int) -> None:
        self.seqs.setdefault(seq, set()).update(range(n))

    def seq_pos_max(self, seq: int) -> int | None:
        cells = self.seqs.get(seq)
        return max(cells) if cells else None


class Live:
    def __init__(self, prefix_len: int, prompt_done: int = 0) -> None:
        self.prefix_len, self.prompt_done = prefix_len, prompt_done


def test_match_insert_split_and_truncate() -> None:
    tree = PrefixTree()
    assert tree.insert(1, [1, 2, 3, 4], "", 10) == 4
    assert tree.insert(2, [1, 2, 9], "", 11) == 1  # splits [1,2,3,4] after 2
    assert tree.cells == 5
    assert tree.match([1, 2, 3, 7], "").length == 3
    assert tree.match([1, 2, 3, 7], "").holders == {1}
    assert tree.match([1, 2, 5], "").holders == {1, 2}
    assert tree.match([5], "").length == 0
    assert tree.path(1) == [1, 2, 3, 4] and tree.path(2) == [1, 2, 9]
    assert tree.shared_cells() == 2
    assert tree.truncate(1, 3) == 1 and tree.path(1) == [1, 2, 3]
    assert tree.remove(1) == 1  # [3]; [1,2] stays: seq 2 holds it
    assert tree.remove(2) == 3 and tree.cells == 0 and not tree.root.children


def test_limit_leaves_the_last_token_to_decode() -> None:
    tree = PrefixTree()
    tree.insert(1, [1, 2, 3], "", 0)
    assert tree.match([1, 2, 3], "", limit=2).length == 2


def test_scopes_never_read_each_other_but_read_public_runs() -> None:
    tree = PrefixTree()
    tree.insert(0, [1, 2, 3], None, -2)  # pinned, public
    tree.insert(1, [1, 2, 3, 4, 5], "alice", 1)
    assert tree.match([1, 2, 3, 4, 5, 6], "bob").length == 3  # the public part only
    assert tree.match([1, 2, 3, 4, 5, 6], "alice").length == 5
    new = tree.insert(2, [1, 2, 3, 4, 5], "bob", 2)
    assert new == 2  # bob's own copy of [4, 5]: cells of its own
    assert tree.match([1, 2, 3, 4], "alice").holders == {1}


def test_random_sequences_keep_cells_equal_to_distinct_paths() -> None:
    """The tree's cell count equals the number of distinct (scope, prefix) positions."""
    rng = random.Random(0)
    tree, held = PrefixTree(), {}
    for step in range(400):
        seq = rng.randrange(12)
        if seq in held and rng.random() < 0.4:
            tree.remove(seq)
            del held[seq]
            continue
        if seq in held:
            cut = rng.randrange(len(held[seq][1]) + 1)
            would = tree.freed_by_truncate(seq, cut)
            assert tree.truncate(seq, cut) == would
            tree.remove(seq)
        toks = [rng.randrange(3) for _ in range(rng.randrange(1, 9))]
        scope = rng.choice(["a", "b"])
        tree.insert(seq, toks, scope, step)
        held[seq] = (scope, toks)
        distinct = {(s, tuple(t[:k])) for s, t in held.values() for k in range(1, len(t) + 1)}
        assert tree.cells == len(distinct)
        for s, (_, t) in held.items():
            assert tree.path(s) == t


def test_cache_shares_keeps_idle_and_evicts_least_recently_used() -> None:
    ctx = FakeCtx()
    cache = PrefixCache(ctx, n_ctx=40, n_seq=3, max_live=3)
    a = list(range(10))
    plan = cache.plan(a, "")
    assert (plan.length, plan.source) == (0, None)
    seq_a = cache.admit(a, plan, 4, "", writer=1, req=Live(0))
    assert cache.cells_used == 14  # 10 prompt + 4 reserved
    ctx.decode(seq_a, 12)
    cache.retire(seq_a, 1, [*a, 100, 101], "")  # 2 generated tokens decoded
    assert cache.cells_used == 12 and seq_a in cache.idle

    b = [*a, 100, 101, 7, 8]  # the next turn: whole history + a new message
    plan = cache.plan(b, "")
    assert (plan.length, plan.source, plan.ready) == (12, seq_a, True)
    seq_b = cache.admit(b, plan, 4, "", writer=2, req=Live(12))
    assert ctx.calls[-1] == ("cp", seq_a, seq_b, 0, 12)
    assert cache.cells_used == 12 + 2 + 4
    cache.retire(seq_b, 2, b, "")
    ctx.decode(seq_b, 14)

    c = [50 + i for i in range(30)]  # unrelated, needs 34 cells: evicts LRU idle
    seq_c = cache.admit(c, cache.plan(c, ""), 4, "", writer=3, req=Live(0))
    assert seq_c is not None and cache.evictions >= 1
    assert ("rm", seq_a) in ctx.calls  # a was used least recently (b read it later, though)
    assert cache.cells_used <= 40


def test_a_prefix_being_prefilled_makes_the_next_request_wait() -> None:
    cache = PrefixCache(FakeCtx(), n_ctx=100, n_seq=4, max_live=4)
    doc = list(range(20))
    writer = Live(0, prompt_done=5)
    cache.admit([*doc, 1], cache.plan([*doc, 1], ""), 4, "", writer=1, req=writer)
    plan = cache.plan([*doc, 2], "")
    assert plan.length == 20 and not plan.ready
    writer.prompt_done = 20
    assert cache.plan([*doc, 2], "").ready


def test_failed_request_is_forgotten_and_cells_return() -> None:
    cache = PrefixCache(FakeCtx(), n_ctx=100, n_seq=2, max_live=2)
    seq = cache.admit([1, 2, 3], cache.plan([1, 2, 3], ""), 5, "", writer=1, req=Live(0))
    assert cache.cells_used == 8
    cache.retire(seq, 1, None, "")
    assert cache.cells_used == 0 and sorted(cache.free) == [0, 1]


def test_nothing_evictable_refuses_and_pinned_stay() -> None:
    ctx = FakeCtx()
    cache = PrefixCache(ctx, n_ctx=20, n_seq=3, max_live=2)
    pin = cache.pin(list(range(10)))
    ctx.decode(pin, 10)
    big = [99] * 15
    assert cache.admit(big, cache.plan(big, ""), 1, "", writer=1, req=Live(0)) is None
    assert pin in cache.pinned and ("rm", pin) not in ctx.calls
    assert cache.pinned_cells == 10
    assert cache.audit() == []


def test_max_live_bounds_admission() -> None:
    cache = PrefixCache(FakeCtx(), n_ctx=100, n_seq=4, max_live=1)
    assert cache.admit([1], cache.plan([1], ""), 1, "", writer=1, req=Live(0)) is not None
    assert cache.admit([2], cache.plan([2], ""), 1, "", writer=2, req=Live(0)) is None


@pytest.mark.parametrize("n", [1, 2, 5])
def test_identical_prompts_count_the_last_token_twice(n: int) -> None:
    """n requests with one prompt: the tree has it once, each decodes its last token itself;
    the cache counts those duplicate cells so it never overfills llama.cpp's."""
    cache = PrefixCache(FakeCtx(), n_ctx=100, n_seq=8, max_live=8)
    toks = list(range(10))
    first = cache.admit(toks, cache.plan(toks, ""), 0, "", writer=0, req=Live(0, 10))
    assert first is not None
    for i in range(1, n):
        assert cache.admit(toks, cache.plan(toks, ""), 0, "", writer=i, req=Live(9)) is not None
    assert cache.cells_used == 10 + (n - 1)


def _finished(cache: PrefixCache, ctx: FakeCtx, toks: list[int], writer: int) -> int:
    """A request for toks admitted, decoded and retired idle: its sequence."""
    seq = cache.admit(toks, cache.plan(toks, ""), 2, "", writer=writer, req=Live(0))
    assert seq is not None
    ctx.decode(seq, len(toks))
    cache.retire(seq, writer, toks, "")
    return seq


def test_a_request_takes_over_its_idle_source_when_nothing_else_makes_room() -> None:
    """Two documents behind one system prompt, each too long to sit beside the other: the
    second keeps the shared system prompt (cut from the first) instead of being refused."""
    ctx = FakeCtx()
    cache = PrefixCache(ctx, n_ctx=40, n_seq=3, max_live=2)
    system, doc_a, doc_b = [1, 2, 3, 4, 5], list(range(10, 35)), list(range(40, 65))
    seq_a = _finished(cache, ctx, [*system, *doc_a], writer=1)
    assert cache.cells_used == 30
    b = [*system, *doc_b]
    plan = cache.plan(b, "")
    assert (plan.length, plan.source) == (5, seq_a)
    seq_b = cache.admit(b, plan, 4, "", writer=2, req=Live(5))
    assert seq_b == seq_a  # the same sequence, cut after the shared prefix
    assert ctx.calls[-1] == ("rm", seq_a, 5, None) and ctx.seqs[seq_a] == set(range(5))
    assert cache.cells_used == 30 + 4 and cache.evictions == 1
    assert cache.reused_tokens == 5 and seq_a not in cache.idle
    ctx.decode(seq_b, len(b))
    cache.retire(seq_b, 2, b, "")
    assert cache.audit() == [] and cache.tree.path(seq_b) == b


@pytest.mark.parametrize(("n_ctx", "taken"), [(46, True), (45, False)])
def test_a_source_gives_up_only_the_cells_no_one_else_holds(n_ctx: int, taken: bool) -> None:
    ctx = FakeCtx()
    cache = PrefixCache(ctx, n_ctx=n_ctx, n_seq=3, max_live=3)
    head = list(range(12))
    seq_a = _finished(cache, ctx, [*head, 50, 51], writer=1)
    live = [*head, 60, 61]  # shares the head with the idle one, still decoding
    assert cache.admit(live, cache.plan(live, ""), 2, "", writer=2, req=Live(12)) is not None
    assert cache.cells_used == 12 + 2 + 2 + 2
    long = [*head, *range(100, 126)]  # 26 new + 4 room: cutting seq_a frees only its 2
    plan = cache.plan(long, "")
    assert (plan.length, plan.source) == (12, seq_a)
    seq = cache.admit(long, plan, 4, "", writer=3, req=Live(12))
    assert (seq == seq_a) is taken and (seq is None) is not taken
    assert cache.cells_used == (46 if taken else 18)


def test_a_live_or_pinned_source_is_never_taken_over() -> None:
    ctx = FakeCtx()
    cache = PrefixCache(ctx, n_ctx=30, n_seq=4, max_live=3)
    pin = cache.pin(list(range(10)))
    ctx.decode(pin, 10)
    toks = [*range(10), *range(50, 65)]  # 10 pinned + 15 new + 4 room = 29 cells of 30: fits
    seq = cache.admit(toks, cache.plan(toks, ""), 4, "", writer=1, req=Live(10))
    assert seq is not None and seq != pin
    again = [*range(10), *range(70, 80)]  # shares the pin (and the live one): waits
    assert cache.admit(again, cache.plan(again, ""), 4, "", writer=2, req=Live(10)) is None
    assert pin in cache.pinned and ("rm", pin, 10, None) not in ctx.calls
    assert seq in cache.live
