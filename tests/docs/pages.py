"""The pages under test and what is read out of them: lines, code spans, tables."""
from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PAGES = sorted(
    [*ROOT.glob("docs/**/*.md"), ROOT / "README.md", *ROOT.glob("services/*/README.md"),
     *ROOT.glob("spark/README.md")]
)


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def pages_text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def lines(page: Path) -> list[tuple[int, str]]:
    """The page's lines, numbered, without HTML comments (notes to editors, not shown to
    readers, such as `<!-- lead: update -->`)."""
    return [(n, re.sub(r"<!--.*?-->", "", line))
            for n, line in enumerate(pages_text(page).splitlines(), start=1)]


def code_spans(page: Path) -> Iterator[tuple[int, str]]:
    """Inline code spans and the lines of fenced blocks (continuation lines joined)."""
    fenced = False
    pending = ""
    start = 0
    for number, line in lines(page):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            if pending:
                line = pending + " " + line.strip()
            else:
                start = number
            if line.rstrip().endswith("\\"):
                pending = line.rstrip()[:-1]
                continue
            pending = ""
            yield start, line.strip()
        else:
            for m in re.finditer(r"`([^`]+)`", line):
                yield number, m.group(1).strip()


def tables(page: Path) -> Iterator[tuple[str | None, list[str], list[tuple[int, list[str]]]]]:
    """Each table with a `default` column: the `FERRY_<X>_` prefix named last before it, its
    header and its rows."""
    prefix = None
    numbered = lines(page)
    i = 0
    while i < len(numbered):
        number, line = numbered[i]
        m = re.search(r"(FERRY_[A-Z0-9_]+_)(?:<KEY>|\*)", line)
        if m:
            prefix = m.group(1)
        if line.startswith("|") and i + 1 < len(numbered) and numbered[i + 1][1].startswith("|---"):
            header = [c.strip().lower() for c in line.strip().strip("|").split("|")]
            rows = []
            i += 2
            while i < len(numbered) and numbered[i][1].startswith("|"):
                rows.append((numbered[i][0], [c.strip() for c in numbered[i][1].strip().strip("|")
                                           .split("|")]))
                i += 1
            if "default" in header and header[0] in ("key", "variable"):
                yield prefix, header, rows
            continue
        i += 1
