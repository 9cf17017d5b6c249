"""swarmkv_bench.figures: a figure on a page is checked against the result file it names, and a
measured figure with no source is caught (so the docs' figure checks can fail)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swarmkv_bench.figures import FigureError, annotate, check, resolve

RESULT = {
    "configs": {
        "N2": {
            "modes": {"fork": {"e2e_ms": {"median": 12.345, "min": 11.0, "max": 13.25}}},
            "speedups": [
                {"mode": "fork", "baseline_mode": "baseline", "speedup_e2e": 2.0666},
                {"mode": "fork", "baseline_mode": "baseline+inv", "speedup_e2e": 1.5},
            ],
        }
    },
    "spread ms": [4.0, 3.5, 4.5],
}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "study").mkdir()
    (tmp_path / "study" / "r.json").write_text(json.dumps(RESULT))
    return tmp_path


def test_paths_walk_keys_indices_and_selections(root: Path) -> None:
    sel = "configs/N2/speedups[mode=fork,baseline_mode=baseline+inv]/speedup_e2e"
    assert resolve(root, "study/r.json", sel) == 1.5
    assert resolve(root, "study/r.json", "spread%20ms/1") == 3.5
    assert resolve(root, "study/r.json", "spread%20ms/@median") == 4.0  # a list's statistic
    assert resolve(root, "study/r.json", "spread%20ms/@max") == 4.5
    with pytest.raises(FigureError, match="matches 2 entries"):
        resolve(root, "study/r.json", "configs/N2/speedups[mode=fork]/speedup_e2e")
    with pytest.raises(FigureError, match="no 'nope' there"):
        resolve(root, "study/r.json", "configs/nope")
    with pytest.raises(FigureError, match="no such result file"):
        resolve(root, "missing.json", "x")


def test_annotated_figures_pass_and_wrong_ones_are_named(root: Path) -> None:
    good = annotate(root, "study/r.json#configs/N2/modes/fork/e2e_ms", ".1f", "spread")
    assert good.startswith("12.3 [11.0-13.2]<!--spread ")
    ratio = annotate(root, "study/r.json#configs/N2/speedups[mode=fork,baseline_mode=baseline]"
                     "/speedup_e2e", ".2f")  # fmt: skip
    listed = annotate(root, "study/r.json#spread%20ms", ".1f", "spread")
    page = f"| fork | {good} | **{ratio}x** |\n| a list's spread: {listed} |"
    assert check(page, root) == []
    stale = page.replace("2.07<!--", "2.06<!--")
    assert any("the file '2.07'" in p for p in check(stale, root))


def test_a_measured_figure_without_a_source_is_caught(root: Path) -> None:
    problems = check("fork took 812.5 ms, run `--rates 0.5`, see [x](a/1.5.md)\n", root)
    assert problems == ["line 1: 812.5 has no <!--fig/spread--> source"]


def test_a_ratio_is_computed_from_the_two_values_it_names(root: Path) -> None:
    a = "configs/N2/speedups[mode=fork,baseline_mode=baseline]/speedup_e2e"
    b = "configs/N2/speedups[mode=fork,baseline_mode=baseline+inv]/speedup_e2e"
    text = annotate(root, f"study/r.json#{a}:{b}", ".3f", "ratio")
    assert text.startswith("1.378<!--ratio study/r.json#")
    assert check(f"ratio {text}x", root) == []
    assert check(text.replace("1.378<", "1.379<"), root)


def test_refresh_rewrites_each_figure_to_what_its_file_now_holds(tmp_path: Path) -> None:
    from swarmkv_bench.figures import check, refresh

    (tmp_path / "r.json").write_text(json.dumps({"a": 1.25, "s": [2.0, 1.0, 3.0], "p": 0.5}))
    page = (
        "x **1.2<!--fig r.json#a .1f-->**x, 9.0 [9.0-9.0]<!--spread r.json#s .1f--> and "
        "50%<!--fig r.json#p .0%--> and 2.50<!--ratio r.json#a:p .2f-->"
    )
    new = refresh(page, tmp_path)
    assert new == (
        "x **1.2<!--fig r.json#a .1f-->**x, 2.0 [1.0-3.0]<!--spread r.json#s .1f--> and "
        "50%<!--fig r.json#p .0%--> and 2.50<!--ratio r.json#a:p .2f-->"
    )
    assert check(new, tmp_path) == []
    (tmp_path / "r.json").write_text(json.dumps({"a": 3.0, "s": [2.0, 1.0, 3.0], "p": 0.25}))
    from swarmkv_bench import figures

    figures._load.cache_clear()
    assert "3.0<!--fig" in refresh(new, tmp_path) and "25%<!--fig" in refresh(new, tmp_path)


def test_text_figures_are_refreshed_whole_and_checked_whole(tmp_path: Path) -> None:
    """A text figure ("8/8", ">= 0.9") is rewritten as a whole, and a page whose text only
    ends like the file's value ("2/1/8" for "1/8") fails the check."""
    from swarmkv_bench import figures
    from swarmkv_bench.figures import check, refresh

    (tmp_path / "t.json").write_text(json.dumps({"same": "2/8", "goal": ">= 0.9"}))
    page = "| 2/8<!--fig t.json#same s--> | >= 0.9<!--fig t.json#goal s--> |"
    assert check(page, tmp_path) == []
    (tmp_path / "t.json").write_text(json.dumps({"same": "1/8", "goal": ">= 1.5"}))
    figures._load.cache_clear()
    new = refresh(page, tmp_path)
    assert new == "| 1/8<!--fig t.json#same s--> | >= 1.5<!--fig t.json#goal s--> |"
    assert check(new, tmp_path) == []
    wrong = "| 2/1/8<!--fig t.json#same s--> | >= 1.5<!--fig t.json#goal s--> |"
    assert len(check(wrong, tmp_path)) == 1
