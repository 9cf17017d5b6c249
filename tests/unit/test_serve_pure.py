"""The server's and its benchmark's plain-Python parts: stop strings held back from a
stream and the OpenAI error mapping (no native library; the benchmark's are in
test_serve_bench_pure.py)."""

from __future__ import annotations

import pytest

from swarmkv.errors import ClosedError, ConfigError, ContextLengthError, QueueFullError
from swarmkv.serve.http.errors import api_error
from swarmkv.serve.http.stream import StopBuffer


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
