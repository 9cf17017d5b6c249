"""A branch that needs only the first W document tokens starts while the prefill goes on.

`required_prefix_tokens=W` makes the prefill publish a snapshot of its first W tokens the
moment they are decoded (a watermark); in host mode that branch restores it into its own
context and decodes concurrently with the rest of the prefill. Tokens stream through
on_token as they are generated.
"""

from __future__ import annotations

import threading
import time

from swarmkv import Pipeline
from swarmkv.cli.demo_doc import DEMO_DOCUMENT

T0 = time.perf_counter()
lock = threading.Lock()
first_seen: dict[str, float] = {}


def on_token(branch: str, token: int, piece: str) -> None:
    """Called from the branch's thread for every generated token."""
    with lock:
        first_seen.setdefault(branch, (time.perf_counter() - T0) * 1e3)


with Pipeline(n_threads=2) as p:
    p.prefill("report", text=DEMO_DOCUMENT * 2)  # about 2,000 tokens: a long prefill
    p.branch(
        "title",
        prompt="\nThe title of the report above is:",
        required_prefix_tokens=64,  # the title is in the first 64 tokens
        n_predict=12,
        stop=["\n"],
        on_token=on_token,
    )
    p.branch("storm", prompt="\nQuestion: When was the storm?\nAnswer:", n_predict=12,
             stop=["\n"], on_token=on_token)  # fmt: skip
    T0 = time.perf_counter()
    result = p.run(mode="host")

doc_ready = result.prefill_ms  # the full document's prefill, from its first chunk
title, storm = result["title"], result["storm"]
print(f"document: {result.prefix_tokens} tokens, prefill took {doc_ready:.0f} ms")
print(f"title (first {title.prefix_tokens} tokens): first token at {title.first_token_ms:.0f} ms,"
      f" answer {title.text.strip()!r}")  # fmt: skip
print(f"storm (all {storm.prefix_tokens} tokens): first token at {storm.first_token_ms:.0f} ms,"
      f" answer {storm.text.strip()!r}")  # fmt: skip
print(f"title answered before the full prefill ended: {title.first_token_ms < doc_ready}")
print(f"streamed first tokens (ms): {', '.join(f'{k} {v:.0f}' for k, v in first_seen.items())}")
