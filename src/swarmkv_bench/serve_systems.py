"""The systems `swarmkv bench --serve` drives, each a fresh process on 127.0.0.1 per run:
`swarmkv serve` and llama-server peers, in either kernel family.

| system              | llama-server flags            | warmed with                      |
|---------------------|-------------------------------|----------------------------------|
| swarmkv             | (`swarmkv serve --max-live 16`) | POST /v1/warm, each head       |
| server-np1          | -np 1, its prompt cache       | each head once                   |
| server-np16-unified | -np 16 --kv-unified,          | 16 copies of the heads at once   |
|                     | --no-cache-idle-slots         |                                  |
| server-np16         | -np 16, a KV cache per slot   | 16 copies of the heads at once   |
| server-np16-restore | -np 16, a KV cache per slot,  | each head prefilled once, saved, |
|                     | --slot-save-path              | restored into the other slots    |
| swarmkv-ray2        | (`swarmkv serve --ray-replicas 2`, the threads split)            |
|                     |                               | POST /v1/warm: on both replicas  |

swarmkv-ray2 (`--ray`) is SwarmKV on two Ray Serve replicas on the same cores, routed by
prefix affinity: measured against one `swarmkv serve`, not as a peer.

Kernel families, like for like: `exact` runs SwarmKV's default (batch-invariant kernels) and
the peers with LLAMA_BATCH_INVARIANT=1 and --no-repack; `plain` runs `swarmkv serve
--no-exact` and the peers as built.
"""

from __future__ import annotations

import math
import re
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .peer_server import (
    LlamaServer,
    ServerConfig,
    build_command,
    read_peak_rss,
    server_options,
    size_n_ctx,
)
from .serve_process import ServeProcess
from .serve_workloads import Workload
from .slot_restore import SAVE_FLAG

# name: (slots, one KV buffer for all slots)
PEERS = {
    "server-np16-unified": (16, True),
    "server-np16": (16, False),
    "server-np16-restore": (16, False),
    "server-np1": (1, False),
}
RESTORED = ("server-np16-restore",)  # warmed from saved slots (slot_restore.py)
RAY_SYSTEM = "swarmkv-ray2"
RAY_REPLICAS = 2
SWARMKV_SYSTEMS = ("swarmkv", RAY_SYSTEM)  # warmed through POST /v1/warm
SYSTEMS = (*SWARMKV_SYSTEMS, *PEERS)
KERNELS = ("exact", "plain")
MAX_LIVE = 16
# A unified peer keeps its idle slots' prompts. By default (--cache-idle-slots) llama-server
# with --kv-unified saves every idle slot into its RAM prompt cache at each task launch and
# clears it from the shared buffer; a cache entry then moves into the one slot that loads it,
# so in a burst on one head all but the first few requests computed the head again
# (docs/results/serve-scale.md, the unified peer at its best). The clearing frees the shared
# buffer for live slots; these peers' buffer holds every slot's longest prompt anyway.
KEEP_IDLE_SLOTS = "--no-cache-idle-slots"


@dataclass(frozen=True)
class Setup:
    """What every system of a run shares."""

    model: Path
    threads: int
    kernels: str
    llama_server: Path | None


@dataclass(frozen=True)
class Sizes:
    """A workload's token counts, which size every system's context."""

    heads: int  # all its shared heads together (0: cold)
    prompt: int  # its longest prompt at its longest: head, every question, every answer
    own: int  # of that prompt, what is not the head


def sizes(work: Workload, model: Any) -> Sizes:
    """The workload's Sizes, counted with the model's tokenizer (n_predict per answer)."""
    worst = max(work.agents, key=lambda a: len(a.head) + sum(map(len, a.questions)))
    head = len(model.tokenize(worst.head))
    asked = sum(len(model.tokenize(q, add_special=False)) for q in worst.questions)
    own = asked + work.n_predict * len(worst.questions)
    heads = sum(len(model.tokenize(h)) for h in work.heads)
    return Sizes(heads, head + own, own if work.heads else head + own)


def open_system(name: str, setup: Setup, work: Workload, size: Sizes) -> Any:
    """The system's server, not yet started (a context manager)."""
    if name in SWARMKV_SYSTEMS:  # the heads resident, each live request's tokens beside
        n_ctx = size.heads + MAX_LIVE * (size.own + work.n_predict) + 1024
        ray = name == RAY_SYSTEM
        threads = max(1, setup.threads // RAY_REPLICAS) if ray else setup.threads
        args = ["-m", str(setup.model), "-c", str(n_ctx), "-t", str(threads)]
        args += ["--max-live", str(MAX_LIVE), "--max-queue", str(max(256, len(work.agents)))]
        args += [] if setup.kernels == "exact" else ["--no-exact"]
        args += ["--ray-replicas", str(RAY_REPLICAS)] if ray else []
        return ServeProcess(args, start_timeout_s=600.0)
    if setup.llama_server is None:
        raise RuntimeError(f"{name} needs llama-server (bench/build_llama_server.sh)")
    if name in RESTORED:
        return _with_slot_folder(setup.llama_server, name, setup, work, size.prompt)
    return LlamaServer(setup.llama_server, peer_config(name, setup, work, size.prompt))


@contextmanager
def _with_slot_folder(
    binary: Path, name: str, setup: Setup, work: Workload, prompt_tokens: int
) -> Iterator[LlamaServer]:
    """A restoring peer with a save folder of its own, removed once the server has stopped
    (whether or not it was ever warmed)."""
    with tempfile.TemporaryDirectory(prefix="swarmkv-slots-") as folder:
        config = peer_config(name, setup, work, prompt_tokens, Path(folder))
        with LlamaServer(binary, config) as server:
            yield server


def peer_config(
    name: str, setup: Setup, work: Workload, prompt_tokens: int, slot_dir: Path | None = None
) -> ServerConfig:
    """The peer's llama-server configuration at its best: every slot holds the longest prompt
    and its answer, flash attention, the full sliding window (like SwarmKV). slot_dir: the
    --slot-save-path of a peer warmed from saved slots (RESTORED), which needs one."""
    n_parallel, unified = PEERS[name]
    extra: tuple[str, ...] = (KEEP_IDLE_SLOTS,) if unified else ()
    if name in RESTORED:
        if slot_dir is None:
            raise ValueError(f"{name} saves its slots: it needs a folder (slot_dir)")
        extra = (SAVE_FLAG, str(slot_dir))
    return ServerConfig(
        setup.model,
        size_n_ctx(prompt_tokens, work.n_predict, n_parallel, kv_unified=unified),
        n_parallel,
        setup.threads,
        512,
        unified,
        swa_full=True,
        flash_attn="on",
        extra_args=extra,
        batch_invariant=setup.kernels == "exact",
    )


def warm_copies(name: str, work: Workload) -> int:
    """How many copies of each head warm a llama-server peer: enough to put one in every
    slot (SwarmKV's systems warm every engine through POST /v1/warm instead)."""
    return max(1, math.ceil(PEERS[name][0] / max(1, len(work.heads))))


def describe(name: str, setup: Setup, server: Any) -> dict[str, Any]:
    """The system's command line, as run (provenance of each peer)."""
    if isinstance(server, LlamaServer):
        options = server_options(server.binary)
        cmd = build_command(server.binary, server.config, server.port or 0, options)
        env = {"LLAMA_BATCH_INVARIANT": "1"} if server.config.batch_invariant else {}
        return {"system": name, "kernels": setup.kernels, "command": cmd, "env": env}
    return {"system": name, "kernels": setup.kernels, "command": ["swarmkv", "serve", *server.args]}


def peak_rss(server: Any) -> int | None:
    """The server process's peak resident set (VmHWM) so far, in bytes."""
    if isinstance(server, LlamaServer):
        return server.peak_rss_bytes()
    proc = getattr(server, "proc", None)
    return read_peak_rss(proc.pid) if proc is not None else None


BUILD_KEYS = re.compile(
    r"^((?:GGML|LLAMA)_\w+|CMAKE_BUILD_TYPE|BUILD_SHARED_LIBS):(?:BOOL|STRING)=(.*)$"
)


STAMP_SUFFIX = ".swarmkv-stamp"  # bench/build_llama_server.sh writes BINARY + this


def parse_stamp(text: str) -> dict[str, Any]:
    """vendor/fetch_llama_cpp.py's tree stamp: `package==version sha256 commit name:hash,...`
    (no patches field for an unpatched tree). Returns the commit and the patches as stamped,
    `name:hash`: the form the library's own build info records (build_ffi.applied_patches,
    which reads the same stamp at build time), so the two compare entry for entry."""
    fields = text.split()
    if len(fields) not in (3, 4) or "==" not in fields[0]:
        raise ValueError(f"not a tree stamp: {text[:200]!r}")
    patches = [p for p in fields[3].split(",") if p] if len(fields) == 4 else []
    return {"source": fields[0], "commit": fields[2], "patches": patches}


def source_stamp(binary: Path) -> dict[str, Any] | None:
    """The vendored tree a peer binary was built from, as build_llama_server.sh stamped it
    beside the binary; None for a binary built another way (its patches are then unknown:
    the SwarmKV library's own may differ, built at another time)."""
    path = Path(str(binary.resolve()) + STAMP_SUFFIX)
    return parse_stamp(path.read_text()) if path.is_file() else None


def binary_info(binary: Path) -> dict[str, Any]:
    """A peer binary's provenance: its --version, the tree it was built from with its patches
    (`source_stamp`), and the build switches of the CMake tree it was built in
    (bench/build_llama_server.sh: BUILD/bin/llama-server beside BUILD's cache)."""
    proc = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    cache = binary.resolve().parent.parent / "CMakeCache.txt"
    flags = {}
    if cache.is_file():
        for line in cache.read_text(errors="replace").splitlines():
            if m := BUILD_KEYS.match(line):
                flags[m.group(1)] = m.group(2)
    return {
        "binary": str(binary),
        "version": (proc.stdout + proc.stderr).strip().splitlines()[-2:],
        "cmake_cache": str(cache) if cache.is_file() else None,
        "tree": source_stamp(binary),
        "build_flags": flags,
    }
