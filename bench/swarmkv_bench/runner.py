"""The benchmark loop: every config, trials alternating baseline and SwarmKV modes in one
process after warm-up, fidelity checked on every trial, peers when built (measuring.md)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarmkv import LLAMA_CPP_COMMIT, info
from swarmkv.context_config import default_threads
from swarmkv.errors import SwarmKVError
from swarmkv.interrupt import Interrupted
from swarmkv.model import Model
from swarmkv.pipeline import Pipeline
from swarmkv.results import PipelineResult

from .modes import ModeSpec, peer_setup, split_modes
from .records import TrialRecord, from_pipeline_result
from .sysinfo import PeakRSS
from .workload import BenchConfig, document, prompts_for

log = logging.getLogger("swarmkv.bench")

# Keeping every step's logits (4 bytes x 262k vocab) lets a divergence be judged as a
# near-tie; past this many branch-steps only the first step is kept, to bound memory.
ALL_LOGITS_LIMIT = 1200


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
                s.name: _pipeline(
                    opts, (flat or model) if s.batch_invariant else model, s, doc, prompts, cfg
                )
                for s in specs
            }
            try:
                for trial in range(-opts.warmup, opts.trials):
                    base = _trial(run, cfg, trial, specs, pipes, progress)
                    _peer_trials(run, cfg, trial, peers, (doc, prompts), base, model, progress)
            finally:
                for p in pipes.values():
                    p.close()
    return run


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
    return {
        "model": model.path.name,
        "model_params": model.n_params,
        "llama_cpp_commit": LLAMA_CPP_COMMIT,
        "patches": ", ".join(facts["patches"]),
        "build": f"CPU {build['cpu_mode']}, CUDA {'on' if build['cuda'] else 'off'}, "
        f"AMX kernels {'in' if facts['amx_kernels'] else 'out'}",
        "threads": opts.threads or default_threads(),
        "cpu": f"{facts['machine_cpu']['name']} ({facts['machine_cpu']['logical_cores']} cores)",
        "ggml_cpu_features": " ".join(facts["ggml_cpu_features"]),
        "gpu": ", ".join(gpus) if gpus else "none",
        "host_pool": facts["host_pool"]["buffer_type"],
        "kv_dtype": "f16",
        "swa_full": "true (default; +swa_window variants: false)",
        "flash_attn": "auto, resolved by llama.cpp per device (+fa_off variants: off)",
        "n_batch": opts.n_batch,
        "n_ctx": opts.n_ctx or "smallest that fits (rounded to 256)",
        "trials": opts.trials,
        "warmup": opts.warmup,
        "document": str(opts.doc_path) if opts.doc_path else "synthetic fox sentence",
    }


def _pipeline(
    opts: BenchOptions, model: Model, spec: ModeSpec, doc: str, prompts: list[str], cfg: BenchConfig
) -> Pipeline:
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
    p.prefill("doc", text=doc)
    for i, prompt in enumerate(prompts):
        p.branch(f"b{i + 1}", prompt=prompt, n_predict=cfg.n_predict)
    return p


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
) -> dict[str, list[int]]:
    """Run every mode once; returns the plain baseline's tokens per branch (for peers)."""
    keep: bool | str = "all" if cfg.n_branches * cfg.n_predict <= ALL_LOGITS_LIMIT else True
    done: dict[str, PipelineResult] = {}
    for spec in specs:  # baselines first: every other mode is checked against its reference
        if progress:
            progress(f"{cfg.config_id} trial {trial} {spec.name}")
        try:
            with PeakRSS() as rss:
                res = pipes[spec.name].run(mode=spec.mode, keep_logits=keep)
        except Interrupted:
            raise  # Ctrl-C ends the benchmark, it is not a broken mode
        except SwarmKVError as exc:  # one broken mode must not sink the whole run
            _note(run, f"{cfg.config_id} {spec.name} trial {trial} failed: {exc}")
            continue
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
            peak_rss_bytes=rss.peak,
            n_branches=cfg.n_branches,
            doc_tokens=cfg.doc_tokens,
            extra={**res.decode_stats, **_waits(res)},
        )
        run.records.append(dataclasses.replace(rec, mode=spec.name))
        done[spec.name] = res
    base = done.get("baseline")
    return {n: list(b.tokens) for n, b in base.branches.items()} if base else {}


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
    base: dict[str, list[int]],
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
        setup, swa_full = peer_setup(name)  # swa_full like for like: it is our default
        rec = peer.run_peer_trial(
            binary,
            run.options.model_path,
            doc=doc,
            prompts=prompts,
            n_predict=cfg.n_predict,
            threads=run.options.threads or default_threads(),
            setup=setup,
            swa_full=swa_full,
            flash_attn="auto",
            n_batch=run.options.n_batch,
            config_id=cfg.config_id,
            trial=trial,
            is_warmup=trial < 0,
            baseline_tokens=base or None,
            branch_names=[f"b{i + 1}" for i in range(cfg.n_branches)],
            tokenizer=model,  # sizes -c from the model already loaded, not a second load
        )
        run.records.append(  # the record names its setup; ours add the +swa_window variant
            dataclasses.replace(
                rec, mode=name, n_branches=cfg.n_branches, doc_tokens=cfg.doc_tokens
            )
        )
