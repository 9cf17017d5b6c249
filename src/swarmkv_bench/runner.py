"""The benchmark loop: every config, trials alternating baseline and SwarmKV modes in one
process after warm-up, fidelity checked on every trial, peers when built (measuring.md)."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import hashlib
import logging
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarmkv import LLAMA_CPP_COMMIT, Pipeline, info
from swarmkv.errors import SwarmKVError
from swarmkv.llama.config import ContextConfig, default_threads
from swarmkv.llama.model import Model
from swarmkv.pipeline.results import PipelineResult
from swarmkv.process.interrupt import Interrupted

from . import memprobe
from .hw_floor import ModelShape
from .hw_peak import measure_peaks
from .kernel_rate import int8_gmacs
from .modes import ModeSpec, peer_setup, split_modes
from .provenance import provenance, script_command, swarmkv_commit
from .records import TrialRecord, from_pipeline_result
from .workload import BenchConfig, document, prompts_for

log = logging.getLogger("swarmkv.bench")

# Keeping every step's logits (4 bytes x 262k vocab) lets a divergence be judged as a
# near-tie; past this many branch-steps only the first step is kept, to bound memory.
ALL_LOGITS_LIMIT = 1200
# A request may wait for every other slot's prefill (npNslots: each slot prefills the whole
# document itself), so the limit grows with the branches: about 7 s per 3501-token prefill on
# two cores, with room for slower machines.
PEER_TIMEOUT_BASE_S = 600.0
PEER_TIMEOUT_PER_BRANCH_DOC_TOKEN_S = 0.01


def peer_timeout_s(cfg: BenchConfig) -> float:
    """The per-request timeout of a llama-server trial for cfg (seconds)."""
    work = cfg.n_branches * (cfg.doc_tokens + cfg.n_predict)
    return PEER_TIMEOUT_BASE_S + PEER_TIMEOUT_PER_BRANCH_DOC_TOKEN_S * work


@dataclass(frozen=True)
class BenchOptions:
    """What to benchmark: model, configs, modes, trial counts, threads and the output folder."""

    model_path: Path
    configs: tuple[BenchConfig, ...]
    modes: tuple[str, ...] = ("baseline", "host", "fork")
    trials: int = 3
    warmup: int = 1
    threads: int | None = None
    n_batch: int = 512
    n_ctx: int | None = None
    doc_path: Path | None = None
    paper: bool = False
    out_dir: Path = Path("results")
    command: str = ""
    peer_bin: Path | None = None
    memory_probe: bool = True  # each mode's peak RSS from a fresh process (memprobe)
    reference_trials: int | None = None  # baselines in fewer trials (32 contexts are slow)


@dataclass
class BenchRun:
    """One benchmark run: its options, every trial record, the setup facts and notes."""

    options: BenchOptions
    records: list[TrialRecord] = field(default_factory=list)
    setup: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


Progress = Callable[[str], None]


def run_bench(opts: BenchOptions, progress: Progress | None = None) -> BenchRun:
    """Run every config: warm-up then measured trials, each running every mode, then peers.

    A mode that raises SwarmKVError is logged in notes and skipped; Interrupted ends the run.
    """
    specs, peers = split_modes(list(opts.modes))
    run = BenchRun(opts)
    # the plain modes get llama.cpp's fastest kernels (repacked weights); batch-invariant
    # modes need the weights as stored: a second model, loaded only when such a mode runs
    with Model(opts.model_path, repack=True) as model, _flat_model(opts, specs) as flat:
        run.setup = _setup(opts, model)
        for cfg in opts.configs:
            doc = document(model, cfg.doc_tokens, opts.doc_path)
            prompts = prompts_for(cfg.n_branches, opts.paper)
            pipes = {
                s.name: pipeline_for(
                    opts, (flat or model) if s.batch_invariant else model, s, doc, prompts, cfg
                )
                for s in specs
            }
            refs: dict[str, PipelineResult] = {}  # the baselines' latest results
            try:
                for trial in range(-opts.warmup, opts.trials):
                    bases = _trial(run, cfg, trial, specs, pipes, progress, refs)
                    _peer_trials(run, cfg, trial, peers, (doc, prompts), bases, model, progress)
            finally:
                for p in pipes.values():
                    p.close()
            if opts.memory_probe:
                _memory_pass(run, cfg, specs, (doc, prompts), progress)
    return run


def _memory_pass(
    run: BenchRun,
    cfg: BenchConfig,
    specs: list[ModeSpec],
    work: tuple[str, list[str]],
    progress: Progress | None,
) -> None:
    """Each mode once more in a fresh process (memprobe): its peak RSS goes on every record of
    that mode and config, so the memory column is the mode's own and not the bench's."""
    opts = run.options
    request = {
        "model": str(opts.model_path),
        "threads": opts.threads,
        "n_batch": opts.n_batch,
        "n_ctx": opts.n_ctx,
    }
    for spec in specs:
        if progress:
            progress(f"{cfg.config_id} memory {spec.name}")
        try:
            mem = memprobe.measure(request | {"mode": spec.name}, cfg, *work)
        except SwarmKVError as exc:
            _note(run, f"{cfg.config_id} {spec.name} memory probe failed: {exc}")
            continue
        run.records[:] = [
            dataclasses.replace(r, peak_rss_bytes=mem["peak_rss_bytes"])
            if (r.config_id, r.mode) == (cfg.config_id, spec.name)
            else r
            for r in run.records
        ]


@contextlib.contextmanager
def _flat_model(opts: BenchOptions, specs: list[ModeSpec]) -> Iterator[Model | None]:
    if not any(s.batch_invariant for s in specs):
        yield None
        return
    with Model(opts.model_path) as flat:
        yield flat


def _setup(opts: BenchOptions, model: Model) -> dict[str, Any]:
    # Machine and build facts come from swarmkv.info(), read off the loaded libraries.
    facts = info()
    gpus = [f"{d['name']} ({d['description']})" for d in facts["devices"] if d["type"] == "GPU"]
    build = facts["build"]
    base = ContextConfig()  # what every mode starts from (variants named in the mode)
    devices = [f"{d['type']} {d['name']}" for d in facts["devices"]]
    return {
        "model": model.path.name,
        "model_params": model.n_params,
        "model_bytes": model.size_bytes,
        # the hardware floor's peaks, measured in this run, and the kernels' own rate beside
        "peaks": measure_peaks(opts.threads or default_threads()).to_dict(),
        "model_shape": ModelShape.from_gguf(model.path).__dict__,
        "int8_gmacs": round(int8_gmacs(opts.threads or default_threads()), 1),
        "llama_cpp_commit": LLAMA_CPP_COMMIT,
        "swarmkv_commit": swarmkv_commit(),
        "patches": ", ".join(facts["patches"]),
        "build": f"CPU {build['cpu_mode']}, CUDA {'on' if build['cuda'] else 'off'}, "
        f"AMX kernels {'in' if facts['amx_kernels'] else 'out'}",
        "threads": opts.threads or default_threads(),
        "cpu": f"{facts['machine_cpu']['name']} ({facts['machine_cpu']['logical_cores']} cores)",
        "ggml_cpu_features": " ".join(facts["ggml_cpu_features"]),
        "gpu": ", ".join(gpus) if gpus else "none",
        "host_pool": facts["host_pool"]["buffer_type"],
        "kv_dtype": f"K {base.type_k}, V {base.type_v}",
        "swa_full": f"{str(base.resolved_swa_full(model)).lower()} (model window "
        f"{model.n_swa or 'none'}; +swa_window variants: false)",
        "flash_attn": f"{base.flash_attn} ({', '.join(devices)}; +fa_off variants: off)",
        "n_batch": opts.n_batch,
        "n_ctx": opts.n_ctx or "smallest that fits (rounded to 256)",
        "trials": opts.trials,
        "warmup": opts.warmup,
        "document": str(opts.doc_path) if opts.doc_path else "synthetic fox sentence",
        # where the result came from: best_run.json and report.md carry it apart from setup
        "provenance": provenance(opts.command or script_command(), opts.model_path),
    }


def pipeline_for(
    opts: BenchOptions, model: Model, spec: ModeSpec, doc: str, prompts: list[str], cfg: BenchConfig
) -> Pipeline:
    """The Pipeline one mode runs in one config: the document's prefill and every branch."""
    p = Pipeline(
        model,
        n_ctx=_n_ctx(opts, spec, cfg),
        n_batch=opts.n_batch,
        n_threads=opts.threads,
        swa_full=spec.swa_full,
        flash_attn=spec.flash_attn,  # type: ignore[arg-type]
        fork=spec.fork,
        exact=spec.batch_invariant,
    )
    if spec.shared:
        p.prefill("doc", snapshot=shared_snapshot(p, doc))
    else:
        p.prefill("doc", text=doc)
    for i, prompt in enumerate(prompts):
        p.branch(f"b{i + 1}", prompt=prompt, n_predict=cfg.n_predict)
    return p


_SNAPSHOT_DIR: list[Path] = []  # one temporary folder per process, removed at exit


def shared_snapshot(pipe: Pipeline, doc: str) -> Path:
    """A `.swkv` snapshot of doc made with pipe's model and settings, saved once (untimed)
    in a temporary folder; "+shared" modes start every run from it."""
    if not _SNAPSHOT_DIR:
        folder = Path(tempfile.mkdtemp(prefix="swarmkv-bench-snap-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        _SNAPSHOT_DIR.append(folder)
    key = hashlib.sha256(repr((doc, pipe.base)).encode()).hexdigest()[:16]
    path = _SNAPSHOT_DIR[0] / f"{key}.swkv"
    if not path.exists():
        with Pipeline(
            pipe.model,
            n_threads=pipe.base.n_threads,
            exact=pipe.base.batch_invariant,
            swa_full=pipe.base.swa_full,
            flash_attn=pipe.base.flash_attn,
        ) as maker:
            maker.prefill("doc", text=doc)
            with maker.snapshot() as snap:
                snap.save(path)
                log.info(
                    "snapshot for +shared: %d tokens, %d bytes, %.1f ms to make",
                    snap.n_tokens,
                    path.stat().st_size,
                    snap.capture_ms or 0.0,
                )
    return path


def _n_ctx(opts: BenchOptions, spec: ModeSpec, cfg: BenchConfig) -> int | None:
    # A fixed n_ctx (the paper's 4096) sizes per-branch contexts; the unified fork context
    # holds every branch, so it is sized by the budget instead.
    if spec.mode == "fork" and spec.fork.layout == "unified" and cfg.n_branches > 1:
        return None
    return opts.n_ctx


def _trial(
    run: BenchRun,
    cfg: BenchConfig,
    trial: int,
    specs: list[ModeSpec],
    pipes: dict[str, Pipeline],
    progress: Progress | None,
    refs: dict[str, PipelineResult],
) -> dict[str, dict[str, list[int]]]:
    """Run every mode once, in rotated order; returns each baseline's tokens per branch (for
    the peers).

    With reference_trials set, baselines run only in the first that many measured trials
    (no warm-up) and later trials are checked against their last result, kept in refs.
    """
    keep = logits_kept(specs, cfg)
    done: dict[str, PipelineResult] = {}
    # Every mode runs first, in an order that rotates from trial to trial (so no mode always
    # follows the same one, nor always runs on a cold or a warm machine); each is checked
    # against its reference after, once all of this trial's results are in.
    for spec in rotate(specs, trial):
        if not _runs_in(run.options, spec, trial):
            if spec.name in refs:
                done[spec.name] = refs[spec.name]
            continue
        if progress:
            progress(f"{cfg.config_id} trial {trial} {spec.name}")
        try:
            done[spec.name] = pipes[spec.name].run(mode=spec.mode, keep_logits=keep)
        except Interrupted:
            raise  # Ctrl-C ends the benchmark, it is not a broken mode
        except SwarmKVError as exc:  # one broken mode must not sink the whole run
            _note(run, f"{cfg.config_id} {spec.name} trial {trial} failed: {exc}")
    for spec in specs:
        res = done.get(spec.name)
        if res is None or not _runs_in(run.options, spec, trial):
            continue  # failed, or a baseline kept from an earlier trial (recorded there)
        ref = done.get(spec.reference) if spec.name != spec.reference else None
        replay = done.get(spec.replay)  # each branch alone with the reference's settings
        rec = from_pipeline_result(
            res,
            exact=spec.claims_exact,
            replay=replay if replay is not res else None,
            config_id=cfg.config_id,
            trial=trial,
            n_predict=cfg.n_predict,
            is_warmup=trial < 0,
            baseline=ref,
            n_branches=cfg.n_branches,
            doc_tokens=cfg.doc_tokens,
            extra={**res.decode_stats, **_waits(res)},
        )
        run.records.append(dataclasses.replace(rec, mode=spec.name))
        if spec.mode == "baseline":
            refs[spec.name] = res
    return {
        s.name: {n: list(b.tokens) for n, b in done[s.name].branches.items()}
        for s in specs
        if s.mode == "baseline" and s.name in done
    }


def rotate(specs: list[ModeSpec], trial: int) -> list[ModeSpec]:
    """specs in the order trial runs them: rotated left by trial (the warm-ups' negative
    trials included), so each mode leads in turn."""
    k = trial % len(specs) if specs else 0
    return [*specs[k:], *specs[:k]]


def logits_kept(specs: list[ModeSpec], cfg: BenchConfig) -> bool | str:
    """What every mode keeps for the fidelity check: each branch's first-step logits, or every
    step's ("all") when a mode that may diverge at a near-tie runs, which that judgement needs.
    Keeping them is timed with the run (the copies alone: extra.logit_capture_ms), so
    only then."""
    may_diverge = any(not s.claims_exact for s in specs if s.mode != "baseline")
    small = cfg.n_branches * cfg.n_predict <= ALL_LOGITS_LIMIT
    return "all" if may_diverge and small else True


def _runs_in(opts: BenchOptions, spec: ModeSpec, trial: int) -> bool:
    """Whether spec runs in this trial (negative: warm-up): baselines may run fewer trials."""
    if spec.mode != "baseline" or opts.reference_trials is None:
        return True
    return 0 <= trial < opts.reference_trials


def _waits(res: PipelineResult) -> dict[str, float]:
    """Time branches queued for a context slot after their input was ready (host)."""
    waits = [b.wait_ms for b in res.branches.values() if b.wait_ms is not None]
    return {"wait_ms_total": sum(waits), "wait_ms_max": max(waits)} if waits else {}


def _note(run: BenchRun, note: str) -> None:
    log.error("%s", note)
    run.notes.append(note)


def _peer_trials(
    run: BenchRun,
    cfg: BenchConfig,
    trial: int,
    peers: list[str],
    work: tuple[str, list[str]],
    bases: dict[str, dict[str, list[int]]],
    model: Model,
    progress: Progress | None,
) -> None:
    doc, prompts = work
    if not peers:
        return
    from . import peer

    binary = run.options.peer_bin or peer.find_llama_server()
    if binary is None:
        note = "llama-server peers skipped: not built (run bench/build_llama_server.sh)"
        if note not in run.notes:
            log.warning(note)
            run.notes.append(note)
        return
    for name in peers:
        if progress:
            progress(f"{cfg.config_id} trial {trial} {name}")
        peer_mode = peer_setup(name)  # swa_full like for like: it is our default
        rec = peer.run_peer_trial(
            binary,
            run.options.model_path,
            doc=doc,
            prompts=prompts,
            n_predict=cfg.n_predict,
            threads=run.options.threads or default_threads(),
            setup=peer_mode.setup,
            swa_full=peer_mode.swa_full,
            batch_invariant=peer_mode.batch_invariant,
            flash_attn="auto",
            n_batch=run.options.n_batch,
            config_id=cfg.config_id,
            trial=trial,
            is_warmup=trial < 0,
            baseline_tokens=bases.get(peer_mode.reference),
            branch_names=[f"b{i + 1}" for i in range(cfg.n_branches)],
            tokenizer=model,  # sizes -c from the model already loaded, not a second load
            timeout_s=peer_timeout_s(cfg),
        )
        run.records.append(  # the record names its setup; ours add the +swa_window variant
            dataclasses.replace(
                rec, mode=name, n_branches=cfg.n_branches, doc_tokens=cfg.doc_tokens
            )
        )
