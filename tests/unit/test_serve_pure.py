"""The server's and its benchmark's plain-Python parts: stop strings held back from a
stream, the OpenAI error mapping, percentiles and the targets (no native library)."""

from __future__ import annotations

import pytest

from swarmkv.errors import ClosedError, ConfigError, ContextLengthError, QueueFullError
from swarmkv.serve.http.errors import api_error
from swarmkv.serve.http.stream import StopBuffer
from swarmkv_bench.serve_bench import Agent, in_flight, percentile, summarize, targets
from swarmkv_bench.swarm_arrivals import Arrival


@pytest.mark.parametrize(
    ("pieces", "stops"),
    [
        (["Hel", "lo wo", "rld. END", " more"], ["END"]),
        (["a", "b", "c", "d"], ["bc", "zz"]),
        (["x", "E", "N", "x", "E", "N", "D", "!"], ["END"]),
        (["no stop at all"], ["###"]),
        (["ab", "ab", "abc"], ["abc"]),
    ],
)
def test_a_stream_never_shows_what_the_final_answer_cuts(
    pieces: list[str], stops: list[str]
) -> None:
    full = "".join(pieces)
    cut = min((full.find(s) for s in stops if s in full), default=len(full))
    final = full[:cut]
    buf = StopBuffer(stops)
    sent = "".join(buf.feed(p) for p in pieces)
    assert final.startswith(sent)
    assert sent + buf.finish(final) == final


def test_library_errors_map_to_openai_statuses() -> None:
    assert api_error(ConfigError("bad")).status == 400
    e = api_error(ContextLengthError("long"), "prompt")
    assert (e.status, e.code, e.param) == (400, "context_length_exceeded", "prompt")
    q = api_error(QueueFullError("full"))
    assert (q.status, q.headers) == (429, {"Retry-After": "1"})
    assert api_error(ClosedError("bye")).status == 503
    with pytest.raises(RuntimeError):  # anything else is the 500 handler's
        api_error(RuntimeError("boom"))


def test_percentile_interpolates_and_knows_empty() -> None:
    assert percentile([], 50) is None
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile(list(range(101)), 99) == 99


def test_summary_and_targets() -> None:
    agents = [
        Agent(i, ttft_ms=10.0 * (i + 1), gaps_ms=[1.0], completion_tokens=2) for i in range(4)
    ] + [Agent(4, error="boom")]
    s = summarize(agents, 2.0)
    assert s["errors"] == 1 and s["tokens"] == 8 and s["tokens_per_s"] == 4.0
    peer = dict(s, system="server-np1", ttft_ms={"p99": s["ttft_ms"]["p99"] * 6}, tokens_per_s=2.0)
    mine = dict(s, system="swarmkv", identical_to_alone=4, compared=4)
    t = targets([{"systems": [mine, peer]}])
    assert t["p99_ttft_ratio"] == [{"server-np1": pytest.approx(6.0)}]
    assert t["tokens_per_s_ratio"] == [2.0] and t["identical"] == ["4/4"]


def test_in_flight_is_the_time_weighted_count_of_open_requests() -> None:
    # arrivals at 0, 1 and 1 s; answers after 2, 2 and 1 s: open 1 for [0,1), 3 for [1,2),
    # 1 for [2,3) -> mean 5/3 over the 3 s span, at most 3
    arrivals = [Arrival(i, t, "q", 4, 0) for i, t in enumerate((0.0, 1.0, 1.0))]
    agents = [Agent(0, done_ms=2000.0), Agent(1, done_ms=2000.0), Agent(2, done_ms=1000.0)]
    assert in_flight(agents, arrivals) == {"mean": pytest.approx(5 / 3), "max": 3.0}
    assert in_flight([Agent(0)], arrivals[:1]) == {"mean": 0.0, "max": 0.0}  # none answered
