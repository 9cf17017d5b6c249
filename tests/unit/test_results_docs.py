"""The docs quote only figures their result files hold, and every result carries provenance.

- Every measured figure in README.md and on the results pages (docs/results/*.md) names its
  source in a comment (swarmkv_bench.figures), and reads exactly what that file holds.
- Every result file under docs/results/ carries the provenance block the bench writes, or,
  for figures quoted from a publication (the seed paper's), says where they were transcribed
  from.
- Every results page shows, under "## Provenance", the lines that block renders to, for each
  result file it quotes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swarmkv_bench.figures import ANNOTATION, check
from swarmkv_bench.provenance import SCHEMA, summary_lines

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "results"
PAGES = sorted(RESULTS.glob("*.md"))
PROVENANCE_KEYS = {
    "date", "command", "swarmkv_commit", "llama_cpp_commit", "patches", "cpu",
    "ggml_cpu_features", "build", "switches", "model",
}  # fmt: skip


def result_files() -> list[Path]:
    """Every JSON result under docs/results/ (a benchmark's best_run.json, a swarm run's
    swarm.json, a study script's output)."""
    return sorted(RESULTS.rglob("*.json"))


def which_mode_table() -> str:
    """The README's one results summary (its other numbers are versions and commands)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    return text.split("<!-- which-mode-table -->", 1)[1].split("<!-- /which-mode-table -->")[0]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_figure_on_a_results_page_reads_what_its_file_holds(page: Path) -> None:
    problems = check(page.read_text(encoding="utf-8"), RESULTS)
    assert not problems, "\n".join(problems)


def test_every_figure_of_the_readme_table_reads_what_its_file_holds() -> None:
    problems = check(which_mode_table(), RESULTS)
    assert not problems, "\n".join(problems)


def test_the_readme_quotes_the_results_pages() -> None:
    table = which_mode_table()
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    assert rows, "the which-mode table is empty"
    for row in rows:
        assert ANNOTATION.search(row), f"a row with no measured figure: {row}"
        assert "](docs/results/" in row, f"a row that links no results page: {row}"


@pytest.mark.parametrize("path", result_files(), ids=lambda p: str(p.relative_to(RESULTS)))
def test_every_result_file_carries_provenance(path: Path) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    if "transcribed_from" in data:  # a publication's figures, not a run of ours
        assert "provenance" not in data and len(data["transcribed_from"]) > 20
        return
    block = data.get("provenance")
    assert isinstance(block, dict), f"{path} has no provenance block"
    assert block.get("schema") == SCHEMA
    missing = PROVENANCE_KEYS - set(block)
    assert not missing, f"{path}: provenance lacks {sorted(missing)}"
    assert block["command"] and block["swarmkv_commit"] and block["cpu"]["flags"]


@pytest.mark.parametrize("page", [p for p in PAGES if p.name != "index.md"], ids=lambda p: p.name)
def test_every_results_page_shows_the_provenance_of_what_it_quotes(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    cited = sorted({m.group(2) for m in ANNOTATION.finditer(text)})
    assert cited, f"{page.name} quotes no result file"
    assert "## Provenance" in text, f"{page.name} has no Provenance section"
    section = text.split("## Provenance", 1)[1]
    for file in cited:
        data = json.loads((RESULTS / file).read_text(encoding="utf-8"))
        if "transcribed_from" in data:
            continue
        block = data["provenance"]
        for line in summary_lines(block):
            assert line in section, f"{page.name}: {file}'s provenance line missing: {line}"
