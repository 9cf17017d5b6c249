"""Bench mode names: each mode's fidelity reference and its replay share its variants."""

from __future__ import annotations

import pytest

from swarmkv.errors import ConfigError
from swarmkv_bench.modes import parse_mode, split_modes


@pytest.mark.parametrize(
    ("name", "reference", "replay", "exact"),
    [
        ("fork", "baseline", "host", False),
        ("fork+inv", "baseline+inv", "host+inv", True),
        ("fork+fa_off", "baseline+fa_off", "host+fa_off", False),
        ("fork+exact+swa_window", "baseline+swa_window", "host+swa_window", True),
        ("host", "baseline", "host", True),
        ("host+inv+shared", "baseline+inv", "host+inv", True),
        ("device+inv", "baseline+inv", "host+inv", True),
    ],
)
def test_reference_and_replay_keep_the_variants(
    name: str, reference: str, replay: str, exact: bool
) -> None:
    spec = parse_mode(name)
    assert (spec.reference, spec.replay, spec.claims_exact) == (reference, replay, exact)


def test_unknown_variant_is_named() -> None:
    with pytest.raises(ConfigError, match="unknown variant 'turbo'"):
        parse_mode("fork+turbo")


def test_shared_starts_from_a_snapshot_in_host_and_fork_only() -> None:
    assert parse_mode("fork+inv+shared").shared and not parse_mode("fork+inv").shared
    with pytest.raises(ConfigError, match="shared variant applies to host and fork only"):
        parse_mode("baseline+shared")


@pytest.mark.parametrize(
    ("names", "specs", "peers"),
    [
        (["fork+inv", "server-np1"], ["baseline+inv", "baseline", "fork+inv"], ["server-np1"]),
        (["server-npN+inv"], ["baseline+inv"], ["server-npN+inv"]),
        (["server-np1+swa_window", "host"], ["baseline", "host"], ["server-np1+swa_window"]),
    ],
)
def test_every_peer_brings_its_reference_baseline(
    names: list[str], specs: list[str], peers: list[str]
) -> None:
    """A peer's tokens are checked against its reference's, so that baseline always runs."""
    got_specs, got_peers = split_modes(names)
    assert [s.name for s in got_specs] == specs and got_peers == peers
