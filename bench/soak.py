#!/usr/bin/env python3
"""A soak run of `swarmkv serve`: workload (b), multi-turn agents re-sending their history,
arriving for --minutes at a rate under capacity, with the server's resources sampled.

    python bench/soak.py [--minutes 30] [--rate 0.1] [--every 30] [--warmup 5] [-o soak.json]

Agents arrive as a Poisson process (seeded) for --minutes; each sends --turns turns over one
shared head (bench --serve's multiturn workload: its head, its questions), each turn the
whole history so far, through the official openai client. Every --every seconds the script
samples the server process's resident memory and open file descriptors (psutil), the KV cells
in use (/metrics), and the p99 time to first token and the errors of the requests that ended
in that window. After --warmup minutes, resident memory, descriptors (the clients' sockets
aside) and KV cells must not grow by more than 5% (the median of the last third of the
samples over that of the first third) and no request may fail. Writes every sample, the
verdict and provenance (-o).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

import swarmkv as sk
from swarmkv_bench.provenance import write_result
from swarmkv_bench.serve_load import Request, client_for, send
from swarmkv_bench.serve_process import ServeProcess
from swarmkv_bench.serve_workloads import question
from swarmkv_bench.workload import document

GROWTH = 0.05  # the bound on growth after the warm-up
CELLS = re.compile(r"^swarmkv_kv_cells_used ([\d.e+]+)$", re.M)


def sample(server: ServeProcess, done: list[Request], since: int, t0: float) -> dict[str, Any]:
    """The server's resources now, and the requests that ended since index `since`."""
    assert server.proc is not None
    proc = psutil.Process(server.proc.pid)
    metrics = httpx.get(server.base_url + "/metrics", timeout=30).text
    cells = CELLS.search(metrics)
    window = done[since:]
    ttfts = sorted(r.ttft_ms for r in window if r.ttft_ms is not None)
    p99 = ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] if ttfts else None
    return {
        "t_s": round(time.perf_counter() - t0, 1),
        "rss_bytes": proc.memory_info().rss,
        "open_fds": proc.num_fds(),
        # descriptors that are not the clients' connections (those come and go with the load)
        "fds_not_sockets": proc.num_fds() - len(proc.net_connections(kind="all")),
        "kv_cells_used": float(cells[1]) if cells else None,
        "requests": len(window),
        "errors": sum(r.error is not None for r in window),
        "ttft_p99_ms": p99,
    }


async def agent(
    client: Any, model: str, head: str, index: int, turns: int, n_predict: int, done: list[Request]
) -> None:
    """One agent's turns, each the history so far plus a new question."""
    history = head
    for turn in range(turns):
        req = Request(index, turn, 0, prompt=history + question(index, turn))
        await send(client, model, req, n_predict)
        done.append(req)
        if req.error is not None:
            return
        history = req.prompt + req.text


async def soak(args: argparse.Namespace, server: ServeProcess, head: str) -> dict[str, Any]:
    client = client_for(server.base_url + "/v1", 600)
    model = (await client.models.list()).data[0].id
    rng = random.Random(args.seed)
    done: list[Request] = []
    samples: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    end = t0 + args.minutes * 60
    next_agent, next_sample, index, tasks = t0, t0 + args.every, 0, []
    while time.perf_counter() < end:
        now = time.perf_counter()
        if now >= next_agent:
            tasks.append(
                asyncio.create_task(
                    agent(client, model, head, index, args.turns, args.n_predict, done)
                )
            )
            index += 1
            next_agent += rng.expovariate(args.rate)
        if now >= next_sample:
            samples.append(sample(server, done, sum(s["requests"] for s in samples), t0))
            print(samples[-1], flush=True)
            next_sample += args.every
        await asyncio.sleep(min(next_agent, next_sample, end) - time.perf_counter())
    await asyncio.gather(*tasks)
    samples.append(sample(server, done, sum(s["requests"] for s in samples), t0))
    await client.close()
    return {
        "samples": samples,
        "agents": index,
        "requests": len(done),
        "errors": sum(r.error is not None for r in done),
    }


def verdict(samples: list[dict[str, Any]], warmup_s: float, errors: int) -> dict[str, Any]:
    """Growth of each resource after the warm-up against the bound, and the errors. Growth is
    the median of the last third of the samples over the median of the first third: the
    load's own ups and downs (live requests, open connections) average out, a leak does not.
    Open descriptors are judged without the clients' sockets, reported with them too."""
    after = [s for s in samples if s["t_s"] >= warmup_s]
    out: dict[str, Any] = {"errors": errors, "samples_after_warmup": len(after)}
    ok = errors == 0 and len(after) >= 3
    third = max(1, len(after) // 3)
    for key in ("rss_bytes", "fds_not_sockets", "kv_cells_used", "open_fds"):
        values = [s[key] for s in after if s[key] is not None]
        if len(values) < 3:
            out[key] = None
            continue
        first, last = statistics.median(values[:third]), statistics.median(values[-third:])
        growth = last / first - 1 if first else float("inf")
        out[key] = {"first": first, "last": last, "max": max(values), "growth": growth}
        if key != "open_fds":
            ok = ok and growth <= GROWTH
    out["pass"] = ok
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--rate", type=float, default=0.1, help="agents per second")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("-n", "--n-predict", type=int, default=32)
    ap.add_argument("--head-tokens", type=int, default=3501)
    ap.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    ap.add_argument("--warmup", type=float, default=5.0, help="minutes before the reference")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-o", "--out", type=Path)
    args = ap.parse_args()
    with sk.Model(sk.default_model_path()) as model:
        head = document(model, args.head_tokens)
    with ServeProcess(["-t", str(args.threads)]) as server:
        body = asyncio.run(soak(args, server, head))
    body["verdict"] = verdict(body["samples"], args.warmup * 60, body["errors"])
    print(f"{'PASS' if body['verdict']['pass'] else 'FAIL'}: {body['verdict']}")
    if args.out:
        write_result(
            args.out, {"args": vars(args) | {"out": str(args.out)}, **body}, sk.default_model_path()
        )
    return 0 if body["verdict"]["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
