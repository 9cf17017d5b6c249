"""The issue's targets, computed from one run's medians (checked by reading, never by tests)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from .metrics import ModeSummary, Speedup
from .records import TrialRecord
from .report import Target
from .sysinfo import memcpy_ms

PAPER = "N2-D3501-P16"
WIDE = "N32-D3501-P32"
WIDEST = "N64-D3501-P32"
Summaries = dict[tuple[str, str], ModeSummary]


def _speedup(sp: Sequence[Speedup], cfg: str, mode: str, base: str = "baseline") -> float | None:
    for s in sp:
        if s.config_id == cfg and s.mode == mode and s.baseline_mode == base:
            return s.speedup_e2e
    return None


def _activation(
    sp: Sequence[Speedup], cfg: str, mode: str, i: int, base: str = "baseline"
) -> float | None:
    for s in sp:
        if s.config_id == cfg and s.mode == mode and s.baseline_mode == base:
            return s.activation_at(i)
    return None


def _extra(records: Sequence[TrialRecord], cfg: str, mode: str, key: str) -> float | None:
    vals = [
        r.extra[key]
        for r in records
        if r.config_id == cfg and r.mode == mode and not r.is_warmup and key in r.extra
    ]
    return statistics.median(vals) if vals else None


def _last_first_token(records: Sequence[TrialRecord], cfg: str, mode: str) -> float | None:
    vals = [
        max(r.first_token_ms)
        for r in records
        if r.config_id == cfg and r.mode == mode and not r.is_warmup and r.first_token_ms
    ]
    return statistics.median(vals) if vals else None


def _notes(*parts: str) -> str:
    """A target's note from its non-empty parts."""
    return "; ".join(p for p in parts if p)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


# the kernel kinds a mode name may carry: plain (llama.cpp's) and batch-invariant (+inv); each
# mode's targets compare it with the baseline of its own kind
KINDS = ("", "+inv")


def kinds_run(summaries: Summaries, cfg: str) -> tuple[str, ...]:
    """The kernel kinds whose fork, host or baseline ran in cfg; plain when none did (so
    the targets are still listed, as not measured)."""
    ran = {m for c, m in summaries if c == cfg}
    found = tuple(
        k for k in KINDS if any(f"{mode}{k}" in ran for mode in ("fork", "host", "baseline"))
    )
    return found or ("",)


def paper_targets(sp: Sequence[Speedup], kinds: Sequence[str] = ("",)) -> list[Target]:
    """Targets of the paper's config (N2-D3501-P16), for each kernel kind that ran: e2e and
    branch-2 activation speedups against the baseline of the same kind."""
    out: list[Target] = []
    for k in kinds:
        fork, host, base = f"fork{k}", f"host{k}", f"baseline{k}"
        vs = f" (vs {base})" if k else ""
        out += [
            Target(f"paper: {fork} speedup_e2e{vs}", _speedup(sp, PAPER, fork, base), 1.85,
                   ">=", "x"),
            Target(f"paper: {host} speedup_e2e{vs}", _speedup(sp, PAPER, host, base), 1.85,
                   ">=", "x"),
            Target(
                f"paper: {host} speedup_activation[1]{vs}",
                _activation(sp, PAPER, host, 1, base),
                52,
                ">=",
                "x",
                "branch 2, to its first generated token",
            ),
            Target(
                f"paper: {fork} speedup_activation[1] (reported){vs}",
                _activation(sp, PAPER, fork, 1, base),
                1.0,
                ">=",
                "x",
                "no target; reported",
            ),
        ]  # fmt: skip
    return out


def wide_targets(
    summaries: Summaries,
    sp: Sequence[Speedup],
    records: Sequence[TrialRecord],
    kinds: Sequence[str] = ("",),
) -> list[Target]:
    """Targets of 32 branches (N32-D3501-P32), for each kernel kind that ran: speedups over
    the baseline of the same kind, llama-server ratios, Python overhead, KV memory."""
    out: list[Target] = []
    for k in kinds:
        out += _wide_targets_of(summaries, sp, records, k)
    return out


def _wide_targets_of(
    summaries: Summaries, sp: Sequence[Speedup], records: Sequence[TrialRecord], k: str
) -> list[Target]:
    fork, host, base = f"fork{k}", f"host{k}", f"baseline{k}"
    fork_e2e = _median(summaries, WIDE, fork)
    np1_first = _last_first_token(records, WIDE, "server-np1")
    fork_first = _last_first_token(records, WIDE, fork)
    # llama-server runs llama.cpp's plain kernels: against an exact fork, the pair is not
    # like for like, and the note says so
    plain_peer = "llama-server runs plain kernels" if k else ""
    return [
        Target(f"32 branches: {fork} vs {base} e2e", _speedup(sp, WIDE, fork, base), 12, ">=",
               "x"),
        Target(
            f"32 branches: {fork} vs llama-server -np N e2e",
            _ratio(_median(summaries, WIDE, "server-npN"), fork_e2e),
            10,
            ">=",
            "x",
            plain_peer,
        ),
        Target(
            f"32 branches: {fork} vs llama-server -np 1 e2e",
            _ratio(_median(summaries, WIDE, "server-np1"), fork_e2e),
            1.0,
            ">=",
            "x",
            _notes("no slower", plain_peer),
        ),
        Target(
            f"32 branches: last first token, llama-server -np 1 / {fork}",
            _ratio(np1_first, fork_first),
            2.0,
            ">=",
            "x",
            _notes("from pipeline start", plain_peer),
        ),
        Target(f"32 branches: {host} vs {base} e2e", _speedup(sp, WIDE, host, base), 8, ">=",
               "x"),
        Target(
            f"32 branches: {fork} Python overhead per generation step",
            _extra(records, WIDE, fork, "python_overhead_pct"),
            5.0,
            "<=",
            "%",
            "everything in a step but llama_decode",
        ),
        _kv_target(summaries, fork),
    ]  # fmt: skip


def scale_targets(
    summaries: Summaries, sp: Sequence[Speedup], records: Sequence[TrialRecord]
) -> list[Target]:
    """The scale issue's targets, each from one run: 32 and 64 branches against the baseline
    (plain and batch-invariant), and a batched step against one branch's step."""
    out = []
    for cfg, need in ((WIDE, 20.0), (WIDEST, 25.0)):
        n = cfg.split("-")[0][1:]
        for mode, base in (("fork", "baseline"), ("fork+inv", "baseline+inv")):
            value = _speedup(sp, cfg, mode, base)
            if value is not None:
                out.append(Target(f"{n} branches: {mode} vs {base} e2e", value, need, ">=", "x"))
    for mode, base in (("fork", "baseline"), ("fork+inv", "baseline+inv")):
        batched = _extra(records, WIDE, mode, "gen_ms_per_step")
        single = _extra(records, WIDE, base, "gen_ms_per_step")  # one row per step
        if batched is not None and single is not None:
            out.append(
                Target(
                    f"32 branches: {mode} step / one branch's step",
                    _ratio(batched, single),
                    3.0,
                    "<=",
                    "x",
                    f"{batched:.1f} ms / {single:.1f} ms ({base}, same run)",
                )
            )
    return out


def restore_target(summaries: Summaries, config_id: str) -> Target | None:
    """host restore per branch against a memcpy of snapshot_bytes, measured now."""
    s = summaries.get((config_id, "host"))
    if s is None or s.restore_all_ms is None or s.snapshot_bytes is None:
        return None
    copy = memcpy_ms(int(s.snapshot_bytes.median))
    return Target(
        f"{config_id}: host restore / memcpy(snapshot_bytes)",
        s.restore_all_ms.median / copy,
        3.0,
        "<=",
        "x",
        f"memcpy of {s.snapshot_bytes.median / 2**20:.1f} MiB took {copy:.2f} ms",
    )


def _kv_target(summaries: Summaries, fork: str = "fork") -> Target:
    one = next(
        (
            s
            for (c, m), s in summaries.items()
            if m == fork and s.n_branches == 1 and c.endswith("-D3501-P32")
        ),
        None,
    )
    wide = summaries.get((WIDE, fork))
    value = None
    if one and wide and one.kv_bytes and wide.kv_bytes:
        value = wide.kv_bytes.median / one.kv_bytes.median
    return Target(
        f"{fork} KV memory, 32 branches / 1 branch",
        value,
        1.5,
        "<=",
        "x",
        "llama.cpp's allocated KV buffers (needs --branches 1,32)",
    )


def _median(summaries: Summaries, cfg: str, mode: str) -> float | None:
    s = summaries.get((cfg, mode))
    return s.e2e_ms.median if s and s.e2e_ms else None


def all_targets(
    summaries: Summaries, sp: Sequence[Speedup], records: Sequence[TrialRecord]
) -> list[Target]:
    """Every target the run's configs allow: paper, 32-branch, and host restore per config."""
    configs = {c for c, _ in summaries}
    out: list[Target] = []
    if PAPER in configs:
        out += paper_targets(sp, kinds_run(summaries, PAPER))
    if WIDE in configs:
        out += wide_targets(summaries, sp, records, kinds_run(summaries, WIDE))
    out += scale_targets(summaries, sp, records)
    for cfg in sorted(configs):
        t = restore_target(summaries, cfg)
        if t is not None:
            out.append(t)
    return out
