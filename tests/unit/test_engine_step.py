"""Engine.step() against a fake context, with no model: which rows each packing puts into one
decode, what a failed decode does, and that one bad request cannot stop the others."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from swarmkv.engine.core import DecodeFailed, Engine
from swarmkv.engine.policy import FairShare
from swarmkv.engine.work import Document, Request, SeqIds
from swarmkv.errors import ConfigError
from swarmkv.llama.sampling import SamplerConfig

EOG = 999


@dataclass
class FakeBatch:
    rows: list[tuple[int, int, tuple[int, ...], bool]] = field(default_factory=list)
    closed: bool = False

    def add(self, token: int, pos: int, seqs: tuple[int, ...], logits: bool = False) -> int:
        self.rows.append((token, pos, seqs, logits))
        return len(self.rows) - 1

    def clear(self) -> None:
        self.rows = []

    @property
    def n_tokens(self) -> int:
        return len(self.rows)

    def close(self) -> None:
        self.closed = True


class FakeModel:
    def is_eog(self, token: int) -> bool:
        return token == EOG

    def token_to_piece(self, token: int) -> bytes:
        return f"<{token}>".encode()


@dataclass
class FakeContext:
    """Records every decode's rows and every seq_cp / seq_rm; `fail_when(rows)` decides
    whether a decode fails."""

    n_batch: int = 8
    n_seq_max: int = 8
    model: FakeModel = field(default_factory=FakeModel)
    decodes: list[list[tuple[int, int, tuple[int, ...], bool]]] = field(default_factory=list)
    copies: list[tuple[int, int, int, int]] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)
    fail_when: Any = None

    def decode(self, batch: FakeBatch) -> None:
        rows = list(batch.rows)
        if self.fail_when is not None and self.fail_when(rows):
            raise RuntimeError("injected decode failure")
        self.decodes.append(rows)

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        self.copies.append((src, dst, p0, p1))

    def seq_rm(self, seq: int, *_: Any) -> None:
        self.removed.append(seq)

    def logits(self, row: int) -> Any:
        return [float(row)]


class FakeSampler:
    """Samples the position of the row's token + 100, so a test can read where a branch
    was; ends (EOG) never: n_predict stops it."""

    def __init__(self, _config: SamplerConfig, _model: Any = None) -> None:
        self.closed = False

    def sample(self, ctx: FakeContext, row: int) -> int:
        return 100 + len(ctx.decodes[-1]) * 0 + row

    def close(self) -> None:
        self.closed = True


def engine(ctx: FakeContext, packing: str = "mixed", **kw: Any) -> Engine:
    return Engine(ctx, packing_name=packing, batch=FakeBatch(), make_sampler=FakeSampler, **kw)


def request(name: str, prompt: list[int], doc: Document | None, w: int, **kw: Any) -> Request:
    kw.setdefault("n_predict", 2)
    return Request(name, prompt, kw.pop("n_predict"), SamplerConfig(), w, doc=doc, **kw)


def seqs_of(rows: list[tuple[int, int, tuple[int, ...], bool]]) -> list[int]:
    return [r[2][0] for r in rows]


def test_phased_decodes_a_document_chunk_alone_then_prompts_then_steps() -> None:
    ctx = FakeContext(n_batch=4)
    eng = engine(ctx, "phased")
    doc = Document("d", list(range(6)), 0, [(0, 4), (4, 6)])
    eng.add_document(doc)
    eng.submit(request("a", [7, 8, 9], doc, 6, seq_id=1))
    eng.submit(request("b", [5], doc, 6, seq_id=2))
    eng.run()
    d = ctx.decodes
    assert [r[1] for r in d[0]] == [0, 1, 2, 3] and seqs_of(d[0]) == [0] * 4
    assert [r[1] for r in d[1]] == [4, 5]  # a chunk never crosses a bound
    # both prompts in one decode at positions continuing the prefix, logits on each last
    assert [(r[0], r[1], r[2][0], r[3]) for r in d[2]] == [
        (7, 6, 1, False),
        (8, 7, 1, False),
        (9, 8, 1, True),
        (5, 6, 2, True),
    ]
    assert seqs_of(d[3]) == [1, 2] and all(r[3] for r in d[3])  # one generation step for both
    assert len(d) == 4  # n_predict=2: the prompt's sample, then one step
    assert ctx.removed == [1, 2] and not eng.live


def test_per_branch_decodes_one_branch_per_step() -> None:
    ctx = FakeContext(n_batch=4)
    eng = engine(ctx, "per_branch")
    for i, name in enumerate("ab"):
        eng.submit(request(name, [1, 2], None, 10, seq_id=i, n_predict=3))
    eng.run()
    assert [seqs_of(rows) for rows in ctx.decodes] == [[0, 0], [1, 1], [0], [1], [0], [1]]


def test_mixed_packs_steps_documents_and_prompts_into_one_decode() -> None:
    ctx = FakeContext(n_batch=8, n_seq_max=4)
    ids = SeqIds(n_ctx=100, max_docs=1, n_seq=4)
    eng = engine(ctx, "mixed", policy=FairShare(), seq_ids=ids)
    doc = Document("d", list(range(20)), ids.take(20, "doc"), [(0, 20)])
    eng.add_document(doc)
    eng.submit(request("a", [7, 7, 7, 7], doc, 4, n_predict=3))
    eng.step()  # nothing admissible yet: the document alone, the whole budget
    assert seqs_of(ctx.decodes[0]) == [0] * 8
    eng.step()  # "a" (watermark 4) admitted: its prefix shared, half the budget each
    assert ctx.copies == [(0, 1, 0, 4)]
    assert sorted(seqs_of(ctx.decodes[1])) == [0] * 4 + [1] * 4
    eng.step()  # a generation row first, then the document
    assert seqs_of(ctx.decodes[2])[0] == 1 and seqs_of(ctx.decodes[2])[1:] == [0] * 7
    assert ctx.decodes[2][0][1] == 8  # the branch's next position: prefix 4 + prompt 4


def test_admission_keeps_the_policys_order_when_cells_run_short() -> None:
    ctx = FakeContext(n_batch=8, n_seq_max=4)
    ids = SeqIds(n_ctx=12, max_docs=1, n_seq=4)
    eng = engine(ctx, "mixed", seq_ids=ids)
    doc = Document("d", [1, 2], ids.take(2, "doc"), [(0, 2)], done=2)
    eng.add_document(doc)
    eng.submit(request("big", [1] * 5, doc, 2, n_predict=4))  # 9 cells of the 10 free
    eng.submit(request("small", [1], doc, 2, n_predict=1))  # 2 cells: waits behind "big"
    eng.step()
    assert [r.name for r in eng.live] == ["big"] and [r.name for r in eng.waiting] == ["small"]
    eng.run()
    assert not eng.live and not eng.waiting and ids.cells_used == 2


def test_a_failed_decode_fails_its_document_and_the_branches_waiting_for_it() -> None:
    """Nothing is counted before the decode returns: the document that was in the failed
    step does not claim its tokens; the branch waiting for it fails with the reason, the
    branch that had rows in the same decode fails too (the decode held its rows), and a
    branch of another document submitted after it finishes."""
    ctx = FakeContext(n_batch=4, n_seq_max=6)
    ids = SeqIds(n_ctx=100, max_docs=2, n_seq=6)
    eng = engine(ctx, "mixed", seq_ids=ids)
    bad = Document("bad", [5] * 6, ids.take(6, "doc"), [(0, 6)])
    good = Document("good", [6] * 3, ids.take(3, "doc"), [(0, 3)], done=3)
    eng.add_document(bad)
    eng.add_document(good)
    finished: list[Request] = []
    eng.submit(request("on-bad", [1], bad, 6, on_finish=finished.append))
    eng.submit(request("beside-bad", [1], good, 3, on_finish=finished.append))
    ctx.fail_when = lambda rows: any(r[2] == (bad.seq_id,) for r in rows)
    assert eng.step()  # the bad document's chunk and beside-bad's prompt: the decode fails
    assert bad.done == 0 and isinstance(bad.error, DecodeFailed)
    assert "injected decode failure" in str(bad.error)
    eng.submit(request("after", [1], good, 3, on_finish=finished.append))
    eng.run()
    by_name = {r.name: r for r in finished}
    assert by_name["on-bad"].error is bad.error and by_name["on-bad"].state is None
    beside = by_name["beside-bad"].state
    assert beside is not None and isinstance(beside.error, DecodeFailed)
    after = by_name["after"].state
    assert after is not None and after.error is None and len(after.tokens) == 2
    assert ids.cells_used == 9  # the branches gave their cells back; the documents keep theirs


def test_a_failed_decode_fails_the_branches_in_it_and_no_others() -> None:
    ctx = FakeContext(n_batch=8)
    eng = engine(ctx, "per_branch")
    done: list[Request] = []
    for i, name in enumerate("abc"):
        eng.submit(request(name, [1, 2], None, 4, seq_id=i, n_predict=3, on_finish=done.append))
    ctx.fail_when = lambda rows: rows[0][2] == (1,) and rows[0][1] == 6  # b's 2nd step only
    eng.run()
    errors = {r.name: r.state.error for r in done if r.state is not None}
    assert isinstance(errors["b"], DecodeFailed) and "injected" in str(errors["b"])
    assert errors["a"] is None and errors["c"] is None
    assert sorted(ctx.removed) == [0, 1, 2]  # the failed branch's cells are freed too


def test_a_raising_token_callback_fails_only_its_branch() -> None:
    ctx = FakeContext(n_batch=8)
    eng = engine(ctx, "phased")

    def boom(*_: Any) -> None:
        raise ValueError("callback bug")

    eng.submit(request("a", [1], None, 0, seq_id=0, on_token=boom))
    eng.submit(request("b", [1], None, 0, seq_id=1))
    eng.run()
    assert not eng.live


def test_abort_fails_live_and_waiting_and_closes_their_samplers() -> None:
    ctx = FakeContext(n_batch=8)
    eng = engine(ctx, "mixed", seq_ids=SeqIds(100, 1, 8))
    doc = Document("d", [1] * 4, 0, [(0, 4)])
    eng.add_document(doc)
    live = request("live", [1], None, 0, seq_id=5, n_predict=50)
    waiting = request("waiting", [1], doc, 4)
    eng.submit(live)
    eng.submit(waiting)
    eng.step()
    assert eng.live == [live] and eng.waiting == [waiting]
    stop = RuntimeError("closed")
    eng.abort(stop)
    assert live.state is not None and live.state.error is stop
    assert live.state.sampler.closed and waiting.error is stop
    assert not eng.live and not eng.waiting


def test_unknown_packing_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown packing 'zigzag'"):
        engine(FakeContext(), "zigzag")
