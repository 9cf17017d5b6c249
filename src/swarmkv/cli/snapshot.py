"""`swarmkv snapshot create` and `swarmkv snapshot info`: KV snapshot files from the shell.

    swarmkv snapshot create --doc report.txt -o report.swkv [-m MODEL] [--no-exact]
    swarmkv snapshot info report.swkv [--json]

`swarmkv run --snapshot report.swkv --branch ...` then starts from the file (cli.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from ..kv.file import check_save_path, open_snapshot_file, read_header
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
        default=None,
        help="batch-invariant kernels, as `swarmkv run` uses by default wherever every backend "
        "has them (a snapshot serves only runs with the same setting)",
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
    from ..process.interrupt import check

    # the document and the output path are checked before the model loads: a bad one fails
    # in milliseconds, not after the load and the whole prefill
    if args.doc == "-":
        text = read_stdin_document("doc")
    else:
        text = read_document("doc", Path(args.doc).expanduser())
    out = Path(args.output).expanduser()
    check_save_path(out)
    model = Path(args.model).expanduser() if args.model else None
    with Pipeline(model, n_threads=args.threads, exact=args.exact) as pipe:
        pipe.prefill("doc", text=text)
        # Ctrl-C (main runs commands under ctrl_c_sets_flag) stops the prefill between
        # chunks; the snapshot is released on the way out and no file is written
        with (
            PrefillBar(sys.stderr.isatty()) as bar,
            pipe.snapshot(progress=bar, check=check) as snap,
        ):
            check()  # a Ctrl-C during the capture: still no file
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
    facts = info_facts(Path(args.path).expanduser())
    if args.json:
        write_json(facts)
    else:
        sys.stdout.write(format_info(facts))
    return 0 if facts["checksum"] == "ok" and facts["this_build"] == "compatible" else 1


def info_facts(path: Path) -> dict[str, Any]:
    """What `snapshot info` reports, as JSON-ready data. A bad format or header raises
    SnapshotMismatchError. Memory stays bounded whatever the file's size: the header is read
    and checked first (its size claim against the file's), a state that does not start like
    a llama.cpp state is reported damaged without reading further, and the checksum is
    computed a chunk at a time."""
    from .._native import BUILD, LLAMA_CPP_COMMIT
    from ..errors import SnapshotMismatchError
    from ..kv.file import check_build, check_state_start, file_digest

    with open_snapshot_file(path) as f:
        header, offset = read_header(f, path)  # format and header checksum, sizes
        file_bytes = os.fstat(f.fileno()).st_size
        try:
            check_state_start(f, offset, path)
        except SnapshotMismatchError:
            checksum = "MISMATCH (state damaged: it does not start like a llama.cpp state)"
        else:
            ok = file_digest(f, offset, header.nbytes) == header.sha256
            checksum = "ok" if ok else "MISMATCH (state damaged)"
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
        "file_bytes": file_bytes,
        "checksum": checksum,
        "this_build": build,
    }


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
