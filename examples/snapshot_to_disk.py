"""Prefill once, save the KV snapshot to a file, load it in another process and continue.

The parent process prefills the document, saves the snapshot atomically (temporary file,
fsync, rename) and answers a question itself. A child process (this script with --load)
loads the file, which checks format, checksum, llama.cpp commit and model fingerprint before
any byte reaches llama.cpp, restores it, and answers the same question with no prefill.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import swarmkv as sk
from swarmkv.cli.demo_doc import DEMO_DOCUMENT, DEMO_QUESTIONS, demo_prompt

CONFIG = sk.ContextConfig(n_ctx=1280, n_batch=512)


def answer(model: sk.Model, ctx: sk.Context, n_doc: int) -> list[int]:
    """Decode the first demo question after the n_doc-token prefix; 16 greedy tokens."""
    prompt = model.tokenize(demo_prompt(DEMO_QUESTIONS[0][1]), add_special=False)
    out: list[int] = []
    with sk.Batch(512) as batch:
        batch.add_sequence(prompt, n_doc, 0)
        for pos in range(n_doc + len(prompt), n_doc + len(prompt) + 16):
            ctx.decode(batch)
            out.append(int(np.argmax(ctx.logits(-1))))
            batch.clear()
            batch.add(out[-1], pos, (0,), logits=True)
    return out


def child(path: Path) -> None:
    with sk.Model(sk.default_model_path()) as model, sk.HostBufferPool() as pool:
        t0 = time.perf_counter()
        snap = sk.KVSnapshot.load(path, pool)
        with sk.Context(model, CONFIG) as ctx:
            ms = sk.restore(ctx, 0, snap)
            print(f"child: loaded in {(time.perf_counter() - t0) * 1e3:.0f} ms, restored in "
                  f"{ms:.1f} ms, no prefill")  # fmt: skip
            print(" ".join(map(str, answer(model, ctx, snap.n_tokens))))
        snap.release()


def parent() -> None:
    with sk.Model(sk.default_model_path()) as model, sk.HostBufferPool() as pool:
        doc = model.tokenize(DEMO_DOCUMENT)
        with sk.Context(model, CONFIG) as ctx, sk.Batch(512) as batch:
            for lo in range(0, len(doc), 512):
                batch.clear()
                batch.add_sequence(doc[lo : lo + 512], lo, 0, logits_last=False)
                ctx.decode(batch)
            snap = sk.capture(ctx, 0, pool, tuple(doc))
            mine = answer(model, ctx, len(doc))
        with tempfile.TemporaryDirectory() as tmp:
            path = snap.save(Path(tmp) / "report.swkv")
            print(f"parent: saved {len(doc)} tokens, {path.stat().st_size / 2**20:.1f} MiB")
            out = subprocess.run([sys.executable, __file__, "--load", str(path)],
                                 capture_output=True, text=True, check=True).stdout  # fmt: skip
        snap.release()
        *lines, theirs = out.strip().splitlines()
        print("\n".join(lines))
        print(f"answer: {model.detokenize(mine).strip().splitlines()[0]!r}")
        print(f"child's answer identical: {[int(t) for t in theirs.split()] == mine}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--load"]:
        child(Path(sys.argv[2]))
    else:
        parent()
