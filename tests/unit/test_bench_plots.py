"""Every plot writes a real PNG from synthetic numbers, and steps aside when its data is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarmkv_bench import plots
from swarmkv_bench.metrics import summarize
from swarmkv_bench.records import TrialRecord
from swarmkv_bench.synthetic import synthetic_records

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# N = 1, 2, 4, 8 at one document length, plus two more document lengths at N = 2.
SWEEP = [(1, 3501, 32), (2, 3501, 32), (4, 3501, 32), (8, 3501, 32), (2, 512, 32), (2, 8000, 32)]


def assert_png(path: Path | None, out: Path) -> None:
    assert path is not None and path.parent == out / "plots"
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 1000


@pytest.fixture(scope="module")
def sweep() -> list[TrialRecord]:
    return synthetic_records(configs=SWEEP, trials=3)


def test_each_plot_writes_a_png(sweep: list[TrialRecord], tmp_path: Path) -> None:
    sums = summarize(sweep)
    assert_png(plots.plot_e2e(sums, tmp_path), tmp_path)
    assert_png(plots.plot_activation(sums, tmp_path, "N8-doc3501-p32"), tmp_path)
    assert_png(plots.plot_prefill_breakdown(sums, tmp_path), tmp_path)
    assert_png(plots.plot_trials(sweep, tmp_path), tmp_path)
    assert_png(plots.plot_scaling_branches(sums, tmp_path), tmp_path)
    assert_png(plots.plot_scaling_doc(sums, tmp_path), tmp_path)
    assert_png(plots.plot_memory(sums, tmp_path), tmp_path)


def test_make_all_plots_returns_every_png(sweep: list[TrialRecord], tmp_path: Path) -> None:
    paths = plots.make_all_plots(sweep, summarize(sweep), tmp_path)
    names = {p.stem for p in paths}
    assert names == {
        "e2e",
        "activation",
        "prefill_breakdown",
        "trials",
        "scaling_branches",
        "scaling_doc",
        "memory",
    }
    for p in paths:
        assert_png(p, tmp_path)


def test_a_single_config_skips_only_the_scaling_plots(tmp_path: Path) -> None:
    records = synthetic_records()
    paths = plots.make_all_plots(records, summarize(records), tmp_path)
    assert {p.stem for p in paths} == {"e2e", "activation", "prefill_breakdown", "trials", "memory"}
    assert plots.plot_scaling_branches(summarize(records), tmp_path) is None
    assert plots.plot_scaling_doc(summarize(records), tmp_path) is None


def test_nothing_to_plot_gives_no_files(tmp_path: Path) -> None:
    assert plots.make_all_plots([], {}, tmp_path) == []
    assert plots.plot_e2e({}, tmp_path) is None
    assert plots.plot_activation({}, tmp_path) is None
    assert plots.plot_prefill_breakdown({}, tmp_path) is None
    assert plots.plot_trials([], tmp_path) is None
    assert plots.plot_memory({}, tmp_path) is None
    assert plots.plot_activation(summarize(synthetic_records()), tmp_path, "no-such") is None


def test_peer_only_data_without_memory_or_costs(tmp_path: Path) -> None:
    # A peer run records only e2e and first-token times: memory has nothing to show.
    rs = [
        TrialRecord(
            config_id="c",
            n_branches=2,
            doc_tokens=100,
            n_predict=8,
            mode="server-npN",
            trial=t,
            e2e_ms=50.0 + t,
            activation_ms=(5.0, 7.0),
        )
        for t in range(3)
    ]
    sums = summarize(rs)
    assert plots.plot_memory(sums, tmp_path) is None
    assert plots.plot_prefill_breakdown(sums, tmp_path) is None
    assert_png(plots.plot_e2e(sums, tmp_path), tmp_path)
    assert_png(plots.plot_activation(sums, tmp_path), tmp_path)
    assert_png(plots.plot_trials(rs, tmp_path), tmp_path)


def test_a_broken_plot_does_not_stop_the_others(
    sweep: list[TrialRecord], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(plots, "plot_memory", boom)
    paths = plots.make_all_plots(sweep, summarize(sweep), tmp_path)
    assert "memory" not in {p.stem for p in paths} and len(paths) == 6
