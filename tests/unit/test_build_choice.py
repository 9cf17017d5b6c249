"""The CUDA/CPU decision of vendor/build_choice.py, from fake probes (no toolkit needed)."""

from __future__ import annotations

import re

import pytest
from vendor_scripts import load

bc = load("build_choice")

NVCC = "/usr/local/cuda/bin/nvcc"
GPU = ["GPU 0: NVIDIA H200 (UUID: GPU-1234)"]


class Probed:
    """A BuildChoice plus the probes that ran to make it."""

    def __init__(self, choice: object, probed: list[str]) -> None:
        self.choice, self.probed = choice, probed

    def __getattr__(self, name: str) -> object:
        return getattr(self.choice, name)


def choose(env: dict[str, str], nvcc: str | None, gpus: list[str]) -> Probed:
    probed: list[str] = []

    def nvcc_probe(_env: dict[str, str]) -> str | None:
        probed.append("nvcc")
        return nvcc

    def gpu_probe() -> list[str]:
        probed.append("gpu")
        return gpus

    return Probed(bc.choose(env, nvcc_probe, gpu_probe), probed)


@pytest.mark.parametrize(
    ("nvcc", "gpus", "cuda"),
    [(NVCC, GPU, True), (NVCC, [], False), (None, GPU, False), (None, [], False)],
)
def test_auto_needs_toolkit_and_gpu(nvcc: str | None, gpus: list[str], cuda: bool) -> None:
    for env in ({}, {"SWARMKV_CUDA": "auto"}, {"SWARMKV_CUDA": ""}):
        choice = choose(env, nvcc, gpus)
        assert choice.cuda is cuda
        assert choice.reason.startswith("auto: ")
        assert choice.probed == ["nvcc", "gpu"]


def test_reason_names_what_was_missing() -> None:
    assert "no GPU" in choose({}, NVCC, []).reason
    assert "no nvcc" in choose({}, None, GPU).reason
    assert NVCC in choose({}, NVCC, GPU).reason and "H200" in choose({}, NVCC, GPU).reason


@pytest.mark.parametrize("value", ["1", "on", "ON", "yes", "true"])
def test_override_on_wins_without_probing(value: str) -> None:
    choice = choose({"SWARMKV_CUDA": value}, None, [])
    assert choice.cuda is True and choice.probed == []
    assert "forces" in choice.reason


@pytest.mark.parametrize("value", ["0", "off", "OFF", "no", "false"])
def test_override_off_wins_without_probing(value: str) -> None:
    choice = choose({"SWARMKV_CUDA": value}, NVCC, GPU)
    assert choice.cuda is False and choice.probed == []


def test_cpu_mode_and_amx_defaults() -> None:
    choice = choose({}, None, [])
    assert (choice.cpu, choice.amx) == ("native", False)
    choice = choose({"SWARMKV_CPU": "portable", "SWARMKV_AMX": "1"}, None, [])
    assert (choice.cpu, choice.amx) == ("portable", True)


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"SWARMKV_CUDA": "maybe"}, "SWARMKV_CUDA='maybe'"),
        ({"SWARMKV_CPU": "fast"}, "SWARMKV_CPU='fast'"),
        ({"SWARMKV_AMX": "auto"}, "SWARMKV_AMX='auto'"),
    ],
)
def test_bad_values_are_named(env: dict[str, str], named: str) -> None:
    with pytest.raises(bc.ChoiceError, match=re.escape(named)):
        choose(env, None, [])


def test_lines_are_what_cmake_parses() -> None:
    text = choose({"SWARMKV_CUDA": "1", "SWARMKV_CPU": "portable"}, None, []).lines()
    assert text.splitlines()[:3] == ["cuda=ON", "cpu=portable", "amx=OFF"]
    assert text.splitlines()[3].startswith("reason=")


def test_main_exits_2_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SWARMKV_CPU", "fastest")
    assert bc.main() == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("build_choice: error: SWARMKV_CPU=")
