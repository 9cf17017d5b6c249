"""exact=None, the default: batch-invariant kernels where every backend has them (the CPU's),
plain otherwise, and the choice reported; kernel switches set per context, none read from the
environment."""

from __future__ import annotations

from pathlib import Path

import pytest

import swarmkv as sk
from swarmkv import Pipeline
from swarmkv.errors import ConfigError
from swarmkv.llama import exactness
from swarmkv.llama.cpu_backend import repack_without_invariance, switch_range
from swarmkv.llama.exactness import resolve_exact
from swarmkv.llama.kernel_switches import KERNEL_SWITCHES


def test_on_a_cpu_build_exact_none_is_exact(tiny_model: sk.Model) -> None:
    assert exactness.devices_without_invariance() == []  # this build and machine: CPU only
    choice = resolve_exact(None, tiny_model)
    assert choice.exact is True and "CPU" in choice.reason
    with Pipeline(tiny_model, n_ctx=256) as pipe:
        assert pipe.exact is True and pipe.base.batch_invariant is True
        pipe.prefill(text="one two three four five six")
        pipe.branch("a", prompt=" seven", n_predict=2)
        result = pipe.run("fork")
    assert result.exact is True and result.to_dict()["exact"] is True


def test_exact_none_is_plain_with_a_device_that_has_no_invariant_mode(
    monkeypatch: pytest.MonkeyPatch, tiny_model: sk.Model
) -> None:
    monkeypatch.setattr(exactness, "devices_without_invariance", lambda: ["CUDA0"])
    choice = resolve_exact(None, tiny_model)
    assert choice.exact is False and "CUDA0" in choice.reason
    with pytest.raises(ConfigError, match=r"exact=True: CUDA0 has no batch-invariant mode"):
        resolve_exact(True, tiny_model)  # refused before any context exists
    with Pipeline(tiny_model, n_ctx=256) as pipe:
        assert pipe.exact is False and pipe.base.batch_invariant is False


def test_repacked_weights_stay_exact_where_cpu_repack_is_the_only_layout(
    tiny_model_path: Path,
) -> None:
    """CPU_REPACK's kernels have a batch-invariant mode (patch 0011): a repacked model runs
    exact by default on a build whose only extra buffer type is CPU_REPACK."""
    with sk.Model(tiny_model_path, repack=True) as repacked:
        if repacked.repacked_without_invariance:  # an AMX build: the next test's case, for real
            pytest.skip(f"this build also repacks into {repacked.repacked_without_invariance}")
        assert repack_without_invariance() == []
        with Pipeline(repacked, n_ctx=256) as pipe:
            assert pipe.exact is True and pipe.base.batch_invariant is True


def test_exact_none_is_plain_where_weights_go_to_kernels_without_the_mode(
    monkeypatch: pytest.MonkeyPatch, tiny_model_path: Path
) -> None:
    """A build that also repacks into AMX (an Intel CPU with AMX): exact=None runs plain,
    exact=True is refused before a context exists, naming the buffer type."""
    with sk.Model(tiny_model_path, repack=True) as repacked:
        monkeypatch.setattr(repacked, "repacked_without_invariance", ("AMX",))
        with Pipeline(repacked, n_ctx=256) as pipe:
            assert pipe.exact is False and "repacked for AMX" in pipe.exact_choice.reason
        with pytest.raises(ConfigError, match=r"repack=True.*repacks into AMX"):
            Pipeline(repacked, n_ctx=256, exact=True)


def test_each_context_holds_its_own_kernel_switches(tiny_model: sk.Model) -> None:
    defaults = {name: switch_range(name)[2] for name in KERNEL_SWITCHES}
    chosen = {"skinny_gemm": 0, "bi_attn": 0, "bi_attn_tile": 7, "kquant_rows": 0}
    assert all(chosen[n] != defaults[n] for n in KERNEL_SWITCHES)
    cfg = sk.ContextConfig(n_ctx=128, batch_invariant=True)
    with (
        sk.Context(tiny_model, cfg, kernel_switches=chosen) as mine,
        sk.Context(tiny_model, cfg) as other,
    ):
        assert mine.kernel_switches() == chosen
        assert other.kernel_switches() == defaults


@pytest.mark.parametrize(
    ("switches", "match"),
    [
        ({"skinny_gemm": 3}, r"skinny_gemm must be in \[0, 2\]"),
        ({"bi_attn_tile": 0}, r"bi_attn_tile must be in \[1, 128\]"),
        ({"skinny_gemm": 1.0}, "must be an integer"),
        ({"skinny": 1}, "unknown kernel switch 'skinny'"),
    ],
)
def test_bad_switches_are_refused_before_a_context_exists(
    tiny_model: sk.Model, switches: dict, match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        sk.Context(tiny_model, n_ctx=128, kernel_switches=switches)
