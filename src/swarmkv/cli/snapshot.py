"""`swarmkv snapshot create` and `swarmkv snapshot info`: KV snapshot files from the shell.

    swarmkv snapshot create --doc report.txt -o report.swkv [-m MODEL] [--no-exact]
    swarmkv snapshot info report.swkv [--json]

`swarmkv run --snapshot report.swkv --branch ...` then starts from the file (cli.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from ..kv.file import SnapshotHeader, payload_offset, read_file_header
from .output import PrefillBar, write_json


def add_parser(subs: Any, common: Any) -> None:
    """The `snapshot` command and its `create` and `info` subcommands."""
    snap = subs.add_parser(
        "snapshot",
        allow_abbrev=False,
        help="create a KV snapshot file of a document, or describe one",
        description="Prefill a document once and save its KV state to a .swkv file that "
        "`swarmkv run --snapshot` (and Pipeline.prefill(snapshot=...)) start from.",
    )
    verbs = snap.add_subparsers(dest="snapshot_command", required=True, metavar="ACTION")
    create = verbs.add_parser(
        "create", allow_abbrev=False, help="prefill a document and save its KV state"
    )
    create.add_argument(
        "--doc", required=True, metavar="FILE", help="the document (UTF-8; - reads standard input)"
    )
    create.add_argument(
        "-o", "--output", required=True, metavar="FILE.swkv", help="the snapshot file to write"
    )
    create.add_argument(
        "--exact",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="batch-invariant kernels, as `swarmkv run` uses by default (a snapshot serves "
        "only runs with the same setting)",
    )
    common(create)
    create.set_defaults(func=cmd_create)
    info = verbs.add_parser("info", allow_abbrev=False, help="describe a snapshot file")
    info.add_argument("path", metavar="FILE.swkv")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.set_defaults(func=cmd_info)


def cmd_create(args: argparse.Namespace) -> int:
    """Prefill --doc once, capture its state and save it atomically to --output."""
    from ..engine.options import read_document, read_stdin_document
    from ..pipeline.builder import Pipeline  # native work only once the arguments are known good

    # the document is read before the model loads: a bad one fails in milliseconds
    if args.doc == "-":
        text = read_stdin_document("doc")
    else:
        text = read_document("doc", Path(args.doc).expanduser())
    out = Path(args.output).expanduser()
    model = Path(args.model).expanduser() if args.model else None
    with Pipeline(model, n_threads=args.threads, exact=args.exact) as pipe:
        pipe.prefill("doc", text=text)
        with PrefillBar(sys.stderr.isatty()) as bar, pipe.snapshot(progress=bar) as snap:
            t = time.perf_counter()
            snap.save(out)
            save_ms = (time.perf_counter() - t) * 1e3
            facts: dict[str, Any] = {
                "path": str(out),
                "tokens": snap.n_tokens,
                "state_bytes": snap.nbytes,
                "file_bytes": out.stat().st_size,
                "prefill_capture_ms": round(snap.capture_ms or 0.0, 3),
                "save_ms": round(save_ms, 3),
            }
    if args.json:
        write_json(facts)
    else:
        sys.stdout.write(
            f"wrote {facts['path']}: {facts['tokens']} tokens, {facts['file_bytes']} bytes "
            f"({facts['file_bytes'] / 2**20:.1f} MiB), prefill + capture "
            f"{facts['prefill_capture_ms']:.1f} ms, save {facts['save_ms']:.1f} ms\n"
        )
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    """Print a snapshot file's header, whether its state checksum holds, and whether this
    build can restore it; exit 1 when it cannot (damaged state, other llama.cpp build)."""
    path = Path(args.path).expanduser()
    header = read_file_header(path)  # format and header checksum: SnapshotMismatchError
    facts = info_facts(path, header)
    if args.json:
        write_json(facts)
    else:
        sys.stdout.write(format_info(facts))
    return 0 if facts["checksum"] == "ok" and facts["this_build"] == "compatible" else 1


def info_facts(path: Path, header: SnapshotHeader) -> dict[str, Any]:
    """What `snapshot info` reports, as JSON-ready data."""
    from .._native import BUILD, LLAMA_CPP_COMMIT
    from ..errors import SnapshotMismatchError
    from ..kv.file import check_build, payload_digest

    raw = path.read_bytes()
    state = _state_bytes(raw)
    try:
        check_build(header, path, LLAMA_CPP_COMMIT, BUILD["patches"])
        build = "compatible"
    except SnapshotMismatchError as exc:
        build = f"incompatible: {exc}"
    return {
        "path": str(path),
        "format_version": 2,
        "created": header.created,
        "swarmkv_version": header.swarmkv_version,
        "llama_cpp_commit": header.llama_cpp_commit,
        "patches": list(header.patches),
        "model_name": header.model_name,
        "model_fingerprint": header.model_fingerprint,
        "context": dict(header.context),
        "state_flags": header.state_flags,
        "tokens": header.n_tokens,
        "state_bytes": header.nbytes,
        "file_bytes": len(raw),
        "checksum": "ok" if payload_digest(state) == header.sha256 else "MISMATCH (state damaged)",
        "this_build": build,
    }


def _state_bytes(raw: bytes) -> bytes:
    header_len = int.from_bytes(raw[8:12], "little")
    return raw[payload_offset(header_len) :]


def format_info(facts: dict[str, Any]) -> str:
    """`snapshot info` as aligned text lines."""
    ctx = ", ".join(f"{k}={v}" for k, v in facts["context"].items())
    rows = [
        ("file", f"{facts['path']} ({facts['file_bytes']} bytes)"),
        ("format", f"SwarmKV snapshot, version {facts['format_version']}"),
        ("created", f"{facts['created']} by swarmkv {facts['swarmkv_version']}"),
        ("llama.cpp", f"{facts['llama_cpp_commit'][:12]}, patches {', '.join(facts['patches'])}"),
        ("model", f"{facts['model_name']} ({facts['model_fingerprint'][:16]})"),
        ("context", ctx),
        ("tokens", str(facts["tokens"])),
        ("state", f"{facts['state_bytes']} bytes, flags {facts['state_flags']}"),
        ("checksum", facts["checksum"]),
        ("this build", facts["this_build"]),
    ]
    return "".join(f"{k:<11} {v}\n" for k, v in rows)
