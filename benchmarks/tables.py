#!/usr/bin/env python
"""The tables of measured figures in the pages, generated from the results files they come from.

A generated table sits between two markers in a markdown page, the first naming the table:

    <!-- table: stop_on_signal -->
    | median step, with | ... |
    <!-- /table -->

`python benchmarks/tables.py` (`make docs-figures`) rewrites every such block from its results file;
`--check` only compares and exits 1 naming each page and table that differs (tests/repo/test_figures.py runs it).
Each table's renderer (benchmarks/table_renderers/) reads one results file (written by a benchmark script with its
provenance: command, commit, CPU, versions, date); `render` ends the table with a `Source:` line naming that file, so
the page says where its numbers are.
A figure typed into a page instead must be bound to the field that holds it, or be labelled in its own sentence or
allowed: benchmarks/figures.py, which `--check` runs too (`figures.py --write` rewrites the bound figures).
"""

import argparse
import json
import os
import re
import sys
from pathlib import Path

import figures  # benchmarks/figures.py: the check of the figures typed outside the generated tables
import table_renderers as renderers  # benchmarks/table_renderers/ (scripts run as benchmarks/<name>.py)

REPO = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- table: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)


CENSUS, TABLES = renderers.CENSUS, renderers.TABLES  # every generated table: name -> (results file, renderer)


def read(path: str) -> dict:
    if path == CENSUS:
        return {"kinds": figures.KINDS, "pages": figures.census()}
    with open(REPO / path, encoding="utf-8") as f:
        return json.load(f)


def source_line(path: str, result: dict, page: Path) -> str:
    """`Source: <file>` (a link from `page`) with the commit, CPU and date the file records (the command that wrote it
    is in the file)."""
    where = result.get("provenance", {})
    facts = [f"commit {where['commit']}" if "commit" in where else None,
             f"{where['cpu'].replace('(R)', '')}, {where['cores']} cores" if "cpu" in where else None,
             where.get("date")]  # fmt: skip
    said = ", ".join(fact for fact in facts if fact)
    link = os.path.relpath(REPO / path, page.parent)
    return f"Source: [{path}]({link})" + (f" ({said})." if said else ".")


def pages() -> list[Path]:
    """Every markdown page of the repository (not in hidden folders or the virtual environment)."""
    return sorted(p for p in REPO.rglob("*.md") if not any(part.startswith(".") for part in p.relative_to(REPO).parts))


def render(name: str, page: Path) -> str:
    """The block's body on `page`: the table, a blank line, the Source line."""
    path, renderer = TABLES[name]
    result = read(path)
    return f"{renderer(result)}\n\n{source_line(path, result, page)}\n"


def regenerated(text: str, page: Path) -> str:
    def block(match: re.Match) -> str:
        name = match.group("name")
        if name not in TABLES:
            raise SystemExit(f"error: {page.relative_to(REPO)} names table {name!r}, which benchmarks/tables.py "
                             f"does not have. Fix: one of {', '.join(sorted(TABLES))}.")  # fmt: skip
        return match.group(1) + render(name, page) + match.group(4)

    return BLOCK.sub(block, text)


def stale_tables(text: str, page: Path) -> list[str]:
    """The names of the generated blocks in `text` (the page at `page`) that differ from their results files."""
    return [match.group("name") for match in BLOCK.finditer(text)
            if match.group("name") in TABLES and match.group("body") != render(match.group("name"), page)]  # fmt: skip


def problems() -> list[str]:
    """Every generated table that differs from its results file, every block naming a table this file does not
    have, and every typed figure of a page that is neither generated, bound to its field, labelled nor allowed
    (benchmarks/figures.py)."""
    found, tracked = [], set(figures.markdown_pages())
    for page in pages():
        text, where = page.read_text(encoding="utf-8"), page.relative_to(REPO)
        found += [f"{where}: table {name} differs from {TABLES[name][0]}. Fix: python benchmarks/tables.py"
                  for name in stale_tables(text, page)]  # fmt: skip
        if str(where) not in tracked:  # figures.problems() names those of the pages git tracks
            found += figures.unknown_tables(str(where), text)
    return found + figures.problems()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="Compare only; exit 1 naming each block that differs.")
    args = parser.parse_args()
    if args.check:
        found = problems()
        for item in found:
            print(f"error: {item}", file=sys.stderr)
        return 1 if found else 0
    for _ in range(2):  # twice: the figure census counts the pages the first pass may have rewritten
        for page in pages():
            text = page.read_text(encoding="utf-8")
            new = regenerated(text, page)
            if new != text:
                page.write_text(new, encoding="utf-8")
                print(f"rewrote {page.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
