"""report.docx beside report.md: the same narrative as a Word document with the plots embedded
(the paper's harness wrote a final_result.docx). Needs python-docx, the `report` extra."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

IMAGE = re.compile(r"^!\[([^\]]*)\]\(([^)]+)\)$")
INLINE = re.compile(r"(\*\*[^*]+\*\*|`[^`]+`)")  # bold and code spans


def docx_available() -> bool:
    """Whether python-docx is installed (pip install 'swarmkv[report]')."""
    return importlib.util.find_spec("docx") is not None


def write_docx(report_md: Path, out: Path) -> Path:
    """Convert report_md (headings, paragraphs, bullets, pipe tables, images relative to its
    folder) into out; returns out."""
    import docx

    doc = docx.Document()
    lines = report_md.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("|"):
            block = []
            while i < len(lines) and lines[i].startswith("|"):
                block.append(lines[i])
                i += 1
            _table(doc, block)
            continue
        _line(doc, line, report_md.parent)
        i += 1
    doc.save(str(out))
    return out


def _line(doc: Any, line: str, folder: Path) -> None:
    from docx.shared import Inches

    text = line.strip()
    if not text:
        return
    heading = re.match(r"^(#{1,4}) (.*)$", text)
    image = IMAGE.match(text)
    if heading:
        doc.add_heading(heading.group(2), level=len(heading.group(1)) - 1)
    elif image and (folder / image.group(2)).is_file():
        doc.add_picture(str(folder / image.group(2)), width=Inches(6))
        doc.add_paragraph(image.group(1), style="Caption")
    elif text.startswith(("- ", "* ")):
        _runs(doc.add_paragraph(style="List Bullet"), text[2:])
    else:
        _runs(doc.add_paragraph(), text)


def _runs(paragraph: Any, text: str) -> None:
    for part in INLINE.split(text):
        if part.startswith("**") and part.endswith("**"):
            paragraph.add_run(part[2:-2]).bold = True
        elif part.startswith("`") and part.endswith("`"):
            paragraph.add_run(part[1:-1]).font.name = "Courier New"
        elif part:
            paragraph.add_run(part)


def _table(doc: Any, block: list[str]) -> None:
    rows = [_cells(r) for r in block if not re.fullmatch(r"\|[\s:|-]+\|?", r.strip())]
    width = max(len(r) for r in rows)
    table = doc.add_table(rows=len(rows), cols=width)
    table.style = "Table Grid"
    for r, cells in enumerate(rows):
        for c, value in enumerate(cells):
            cell = table.cell(r, c)
            cell.text = value
            if r == 0:
                for run in cell.paragraphs[0].runs:
                    run.bold = True


def _cells(row: str) -> list[str]:
    return [c.strip().replace("**", "") for c in row.strip().strip("|").split("|")]
