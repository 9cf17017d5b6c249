"""Benchmark mode names: a handoff mode plus variants, e.g. "fork+streams+per_branch".

| variant     | meaning                                                            |
|-------------|--------------------------------------------------------------------|
| streams     | fork: one KV stream per sequence (seq_cp copies the prefix)       |
| per_branch  | fork: one decode per branch per step (the baseline's shapes)       |
| exact       | fork: streams + per_branch (bit-identical to the baseline)         |
| inv         | batch-invariant kernels (Pipeline(exact=True), `swarmkv run --exact`) |
| fa_off      | flash attention off (default: auto, i.e. on for the CPU)           |
| swa_window  | swa_full=False: window-sized SWA cache (smaller, not exact)        |
| shared      | host/fork: start from a `.swkv` snapshot of the document, created  |
|             | once before the trials and mapped shared (read only) by each run: |
|             | no prefill, branches restore straight from the mapping            |

A variant's fidelity reference is the baseline with the same swa_window/fa_off/inv variants;
a mode with "inv" (or "exact") is judged strictly: any difference is a failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from swarmkv.errors import ConfigError
from swarmkv.pipeline.modes import MODES, ForkOptions

from .peer_server import SETUPS, Setup

VARIANTS = ("streams", "per_branch", "exact", "inv", "fa_off", "swa_window", "shared")
# llama-server run with --swa-full (like for like with SwarmKV's default), "+swa_window" at its
# own default (window-sized SWA cache), and "+inv" with the batch-invariant kernels
# (LLAMA_BATCH_INVARIANT=1, weights not repacked): "server-" + a setup name + variant.
PEER_PREFIX = "server-"
PEER_VARIANTS = ("", "+swa_window", "+inv")
PEERS = tuple(f"{PEER_PREFIX}{s}{v}" for v in PEER_VARIANTS for s in SETUPS)


class PeerMode(NamedTuple):
    """A parsed peer mode name: the llama-server setup and how the server is run."""

    setup: Setup
    swa_full: bool
    batch_invariant: bool

    @property
    def reference(self) -> str:
        """The baseline whose tokens the server's must equal: with +inv the batch-invariant
        one (any difference is then a failure, as for SwarmKV's own inv modes)."""
        return "baseline+inv" if self.batch_invariant else "baseline"


def peer_setup(name: str) -> PeerMode:
    """The PeerMode of a peer mode name such as "server-npN+swa_window"."""
    if name not in PEERS:
        raise ConfigError(f"unknown peer {name!r}; known: {', '.join(PEERS)}")
    head, _, variant = name.removeprefix(PEER_PREFIX).partition("+")
    setup = next(s for s in SETUPS if s == head)
    return PeerMode(setup, swa_full=variant != "swa_window", batch_invariant=variant == "inv")


def peer_setups(spec: str) -> tuple[Setup, ...]:
    """The setups a --peers value names: "all", "none", or a comma list such as np1,npN
    (a "server-" prefix is accepted). ConfigError naming the choices for anything else."""
    if spec in ("all", "none"):
        return SETUPS if spec == "all" else ()
    names = [n.strip().removeprefix(PEER_PREFIX) for n in spec.split(",") if n.strip()]
    chosen = tuple(s for n in names for s in SETUPS if s == n)
    if not names or len(chosen) != len(names):
        raise ConfigError(f"--peers {spec!r}: give all, none or a comma list of {SETUPS}")
    return chosen


@dataclass(frozen=True)
class ModeSpec:
    """A parsed bench mode: handoff mode plus its fork, flash-attention and SWA settings."""

    name: str
    mode: str  # host | fork | baseline
    fork: ForkOptions
    flash_attn: str
    swa_full: bool | None
    batch_invariant: bool = False
    shared: bool = False  # starts from a snapshot file mapped shared (see the table)

    @property
    def claims_exact(self) -> bool:
        """Whether any difference from the reference is a failure (host, inv, exact)."""
        return self.batch_invariant or self.mode == "host" or "+exact" in self.name

    @property
    def reference(self) -> str:
        """The baseline mode name this mode's fidelity is judged against."""
        return "+".join(["baseline", *self._shared_variants()])

    @property
    def replay(self) -> str:
        """The host mode that replays each branch alone with the reference's settings: the
        proof a divergence needs to count as a near-tie."""
        return "+".join(["host", *self._shared_variants()])

    def _shared_variants(self) -> list[str]:
        return [v for v in ("inv", "fa_off", "swa_window") if f"+{v}" in self.name]


def parse_mode(name: str) -> ModeSpec:
    """The ModeSpec of a name such as "fork+streams"; exact implies streams and per_branch.

    ConfigError for an unknown mode or variant.
    """
    head, *variants = name.split("+")
    if head not in MODES:
        raise ConfigError(f"unknown bench mode {name!r}: starts with one of {', '.join(MODES)}")
    for v in variants:
        if v not in VARIANTS:
            raise ConfigError(f"unknown variant {v!r} in {name!r}; known: {', '.join(VARIANTS)}")
    exact = "exact" in variants
    fork = ForkOptions(
        layout="streams" if exact or "streams" in variants else "unified",
        packing="per_branch" if exact or "per_branch" in variants else "batched",
    )
    return ModeSpec(
        name=name,
        mode=head,
        fork=fork,
        flash_attn="off" if "fa_off" in variants else "auto",
        swa_full=False if "swa_window" in variants else None,
        batch_invariant="inv" in variants,
        shared=_shared(name, head, variants),
    )


def _shared(name: str, head: str, variants: list[str]) -> bool:
    if "shared" in variants and head not in ("host", "fork"):
        raise ConfigError(f"{name!r}: the shared variant applies to host and fork only")
    return "shared" in variants


def split_modes(names: list[str]) -> tuple[list[ModeSpec], list[str]]:
    """SwarmKV modes (with every reference baseline they and the peers need, baselines
    first) and peers."""
    specs: dict[str, ModeSpec] = {}
    peers = []
    for name in names:
        if name in PEERS:  # a peer's tokens are checked against its reference baseline's
            peers.append(name)
            ref = parse_mode(peer_setup(name).reference)
            specs.setdefault(ref.name, ref)
            continue
        spec = parse_mode(name)
        ref = parse_mode(spec.reference)
        specs.setdefault(ref.name, ref)
        specs.setdefault(name, spec)
    ordered = sorted(specs.values(), key=lambda s: s.mode != "baseline")
    return ordered, peers
