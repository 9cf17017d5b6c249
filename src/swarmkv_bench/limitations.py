"""The report's limitations, written from what the run did and measured (not fixed text)."""

from __future__ import annotations

import statistics

from .metrics import ModeSummary
from .modes import PEERS, split_modes
from .records import TrialRecord
from .runner import BenchRun, logits_kept


def limitations(run: BenchRun, summaries: dict[tuple[str, str], ModeSummary]) -> list[str]:
    """One line per limit that applies to this run, then the run's own notes."""
    setup, opts = run.setup, run.options
    lines = [_hardware(setup), _prompts(opts.paper)]
    measured = [r for r in run.records if not r.is_warmup]
    modes = {r.mode for r in measured}
    waits = [r.extra["wait_ms_max"] for r in measured if "wait_ms_max" in r.extra]
    if any(m.startswith("host") for m in modes) and waits:
        lines.append(
            "host decodes one branch context at a time (every context already uses all "
            f"{setup.get('threads')} threads): branches queued up to {max(waits):.1f} ms for "
            "their context; branch_activation_ms excludes that queue, first_token_ms "
            "includes it (all_trials.csv: extra.wait_ms_max)."
        )
    shared = sorted(m for m in modes if "+shared" in m)
    if shared:
        lines.append(
            f"{', '.join(shared)} start from a snapshot file made once before the trials (one "
            "prefill and save, not in their e2e): they show what a later agent or process "
            "pays, not the first one."
        )
    if modes & set(PEERS):
        lines.append(
            "llama-server tokenizes document + prompt as one string, so against it only "
            "token equality is comparable; its start-up is excluded from e2e."
        )
    specs, _ = split_modes(list(opts.modes))
    if any(logits_kept(specs, cfg) == "all" for cfg in opts.configs):
        lines.append(
            "A mode that may diverge at a near-tie ran, so every mode kept every step's logits "
            f"for that judgement, and e2e includes copying them ({_capture_ms(measured)}) and "
            "whatever else holding them costs (Python overhead under 'Where the time goes'); "
            "runs of exact modes only keep the first step's."
        )
    lines += _fidelity(summaries, measured)
    if not opts.memory_probe:
        lines.append("Peak RSS of SwarmKV modes not measured (--no-memory-probe).")
    if opts.reference_trials is not None:
        lines.append(
            f"Baselines ran in {opts.reference_trials} measured trial(s) without a warm-up "
            "(--reference-trials); later trials are checked against their last result."
        )
    if opts.trials < 3:
        lines.append(f"{opts.trials} measured trial(s) per mode: fewer than the 3 to quote.")
    return [*lines, *run.notes]


def _capture_ms(measured: list[TrialRecord]) -> str:
    """The measured copy time of kept logits per run: the median over trials, per mode."""
    per_mode: dict[str, list[float]] = {}
    for r in measured:
        if "logit_capture_ms" in r.extra and r.n_branches > 1:
            per_mode.setdefault(f"{r.mode} at {r.n_branches}", []).append(
                r.extra["logit_capture_ms"]
            )
    if not per_mode:
        return "extra.logit_capture_ms: not recorded"
    medians = [f"{m} {statistics.median(v):.1f} ms" for m, v in sorted(per_mode.items())]
    return "extra.logit_capture_ms per run, median: " + ", ".join(medians)


def _hardware(setup: dict[str, object]) -> str:
    where = f"{setup.get('cpu')}, {setup.get('threads')} threads, build {setup.get('build')}"
    if setup.get("gpu") in (None, "none"):
        return f"CPU only ({where}): no GPU was present, so there are no GPU figures."
    return f"Measured with GPU {setup.get('gpu')} ({where})."


def _prompts(paper: bool) -> str:
    what = "the paper's setup with" if paper else "generated workload with"
    return (
        f"A {what} stand-in branch questions (workload.prompts_for): the paper's own prompts "
        "are not published."
    )


def _fidelity(
    summaries: dict[tuple[str, str], ModeSummary], measured: list[TrialRecord]
) -> list[str]:
    out = []
    failed = [s for s in summaries.values() if s.fidelity_failed]
    for s in failed:
        out.append(
            f"{s.mode} in {s.config_id}: {s.fidelity_failed} of {s.fidelity_checked} checked "
            "trials differ from the reference beyond a near-tie (see Fidelity)."
        )
    ties = sum(1 for r in measured if r.extra.get("fidelity_near_ties", 0) > 0)
    if ties:
        out.append(f"{ties} measured trial(s) diverged at a near-tie (allowed; listed above).")
    refs = ("baseline",)  # the references themselves
    unchecked = [
        s.mode for s in summaries.values() if not s.fidelity_checked and not s.mode.startswith(refs)
    ]
    if unchecked:
        out.append(f"Not checked against a reference: {', '.join(sorted(set(unchecked)))}.")
    return out
