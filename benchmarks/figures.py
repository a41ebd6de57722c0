#!/usr/bin/env python
"""Every measured-looking number in the repository's markdown pages has a provenance the check can see.

A figure is a number with a unit of time (`s`, `ms`, `us`, `µs`, `min`, `minutes`, `h`, `hours`, `seconds`), a ratio
(`1.7x`, `1.7×`), a percentage, a rate (`img/s`, `images/s`), a size (`KB`, `MB`, `MiB`, `GB`, `GiB`), `points`, or
a `0.xx` value on a line that speaks of accuracy, AUROC, F1 or loss. Each figure must be one of:

- generated: inside a `<!-- table: ... -->` block (benchmarks/tables.py rewrites it from its results file);
- sourced: the number itself occurs in a results file named on its line or in its paragraph (`*.json`/`*.csv` under
  benchmarks/results/ or beside the page, or a study folder `docs/studies/<name>/`; a page inside a study folder
  names its own folder). The page may round: 1.72 matches 1.7241960, 148 matches 148.3; a percentage may be the
  file's fraction (6.6% for 0.0662), ms or µs its seconds (6.1 µs for 6.149e-06). A named file that does not
  hold the number does not pass it, and a name that is no file (`throughput.json`) names nothing;
- labelled: its line, its paragraph or one of its headings carries a label word of `EXTERNAL` (a cited source) or
  `EARLIER` (an earlier measurement no results file holds);
- allowed: listed for its page in benchmarks/figure_allowances.py with a reason. An entry that no longer matches
  a figure is itself reported, so the list only holds what is still on the page.

`python benchmarks/tables.py --check` runs this check with the tables' (tests/repo/test_figures.py runs both);
`python benchmarks/figures.py` prints how many figures of each class each page holds.
"""

import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal
from functools import cache
from pathlib import Path

from figure_allowances import ALLOWED  # benchmarks/figure_allowances.py (scripts run as benchmarks/<name>.py)

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"

# The label words, matched case-insensitively as whole words (a trailing "s" allowed) on a figure's line, in its
# paragraph or in its headings. A cited source outside this repository:
EXTERNAL = ("arXiv", "paper", "et al.", "for reference", "reference figure", "datasheet", "http://", "https://")
# A measurement this project made once and kept in no results file:
EARLIER = ("earlier measurement", "earlier run", "earlier count", "measured once", "no results file")

NUMBER = r"\d[\d,]*(?:\.\d+)?"
UNIT = (r"(?:\s?(?:ms|us|µs|μs|s|sec|seconds?|min|minutes?|h|hours?|img/s|images/s|KB|KiB|MB|MiB|GB|GiB|TB|points?)"
        r"(?![\w/])|\s?%|[x×](?![\w-]))")  # fmt: skip
# A figure: a number or a range of numbers ("113-152 s") with its unit, not part of a longer token (v1.2, 3e-5).
UNIT_FIGURE = re.compile(rf"(?<![\w.\-−+/])[-−+]?{NUMBER}(?:\s?(?:-|–|to)\s?[-−+]?{NUMBER})?{UNIT}")
SCORE = re.compile(r"(?<![\w.\-/])0\.\d{2,}(?![\d\w])")
SCORE_WORDS = re.compile(r"accurac|\bacc\b|auroc|\bauc\b|\bf1\b|loss|top-?1", re.I)
NUMBERS = re.compile(r"\d[\d,]*(?:\.\d+)?")
# Unsigned (the page's −2.1% is the file's -0.021), with its exponent (6.149e-06 is one number, not 6.149 and 06).
# An exponent only on a token of its own (a commit's "3e4f" or "5e999999" is no number in scientific notation).
FILE_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?[eE][-+]?\d{1,3}(?![\w.])|\d+(?:\.\d+)?")
# A page's ms or µs may be a file's seconds: 6.1 µs is 6.149e-06 s times 1e6.
SCALES = {"%": (1, 100), "ms": (1, 1_000), "us": (1, 1_000_000), "µs": (1, 1_000_000), "μs": (1, 1_000_000)}
# A results file or a study folder named in a page: a path ending in .json/.csv, or docs/studies/<name>/...
NAMED_FILE = re.compile(r"[\w./-]*[\w-]+\.(?:json|csv)\b")
NAMED_STUDY = re.compile(r"(?:docs/)?studies/[\w/.-]*\w")
GENERATED_BLOCK = re.compile(r"<!-- table: [\w-]+ -->\n.*?<!-- /table -->", re.S)
LABEL = re.compile("|".join(rf"(?<!\w){re.escape(word)}s?(?!\w)" if word[-1].isalpha() else re.escape(word)
                            for word in EXTERNAL + EARLIER), re.I)  # fmt: skip


@dataclass(frozen=True)
class Figure:
    page: str  # relative to the repository
    line: int  # 1-based
    text: str  # as on the page: "148.7 s", "1.72x", "0.8473"
    kind: str = ""  # generated | sourced | labelled | allowed | "" (none: a problem)


def markdown_pages() -> list[str]:
    """Every markdown page git tracks (a new page is checked once it is added)."""
    out = subprocess.run(["git", "ls-files", "*.md"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return sorted(out.split())


def generated_lines(text: str) -> set[int]:
    """The 0-based line numbers inside generated blocks (markers included)."""
    lines = set()
    for match in GENERATED_BLOCK.finditer(text):
        first = text.count("\n", 0, match.start())
        lines.update(range(first, first + match.group(0).count("\n") + 1))
    return lines


def paragraphs(lines: list[str]) -> list[tuple[int, int]]:
    """Per line, the (start, end) line span of its paragraph: the run of non-blank lines it is in."""
    spans, start = [], 0
    for i, line in enumerate(lines):
        if not line.strip():
            start = i + 1
        spans.append((start, i + 1))
    for i in range(len(lines) - 2, -1, -1):  # each span runs to its paragraph's last line
        if lines[i].strip() and lines[i + 1].strip():
            spans[i] = spans[i + 1]
    return spans


def context_span(i: int, lines: list[str], spans: list[tuple[int, int]]) -> tuple[int, int]:
    """The lines that speak for line `i`: its paragraph, and for a table also the paragraph just before it (its
    caption) and just after it (its `Source:` line)."""
    start, end = spans[i]
    if not lines[i].startswith("|"):
        return start, end
    before = spans[start - 2][0] if start >= 2 and lines[start - 2].strip() else start
    follows = end + 1 < len(lines) and lines[end + 1].strip() and not lines[end + 1].startswith("#")
    after = spans[end + 1][1] if follows else end
    return before, after


def heading_chains(lines: list[str]) -> list[str]:
    """Per line, the text of the headings it sits under (outside fenced code), joined."""
    chains, stack, fenced = [], [], False
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and re.match(r"#{1,6} ", line):
            level = len(line) - len(line.lstrip("#"))
            stack = [(lvl, text) for lvl, text in stack if lvl < level] + [(level, line)]
        chains.append(" ".join(text for _, text in stack))
    return chains


def table_headers(lines: list[str]) -> list[str]:
    """Per line, the header row of the table it is in ("" outside tables): a score column's cells need no word."""
    headers, header = [], ""
    for line in lines:
        if not line.startswith("|"):
            header = ""
        elif not header:
            header = line
        headers.append(header)
    return headers


def figures_on(line: str, context: str) -> list[str]:
    """The figures in `line`: numbers with a unit, and 0.xx scores where `context` (the line and its table's header)
    speaks of accuracy, AUROC, F1 or loss."""
    found = [(m.start(), m.group(0)) for m in UNIT_FIGURE.finditer(line)]
    if SCORE_WORDS.search(context):
        taken = [range(start, start + len(text)) for start, text in found]
        found += [(m.start(), m.group(0)) for m in SCORE.finditer(line) if not any(m.start() in r for r in taken)]
    return [text for _, text in sorted(found)]


def named_files(text: str, page: str) -> list[Path]:
    """The existing results files and study-folder files `text` (on `page`) names; a page in a study folder (one
    holding results.csv) names its own folder's files."""
    found = []
    here = (REPO / page).parent
    for name in NAMED_FILE.findall(text):
        candidates = [here / name, REPO / name, RESULTS / Path(name).name]
        found += [c for c in candidates if c.is_file()][:1]
    for name in NAMED_STUDY.findall(text):
        for base in (REPO / "docs", here, REPO):
            folder = base / name if (base / name).is_dir() else (base / name).parent
            if (folder / "results.csv").is_file() or folder.parent.name == "studies":
                found += [p for p in folder.rglob("*") if p.suffix in {".csv", ".json", ".md"}]
                break
    if (here / "results.csv").is_file():
        found += [p for p in here.iterdir() if p.suffix in {".csv", ".json"}]
    return found


@cache
def file_numbers(path: Path) -> frozenset[str]:
    """Every number in the file as plain decimals (the file's 6.149e-06 as 0.000006149)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    return frozenset(format(Decimal(number), "f") for number in FILE_NUMBER.findall(text))


def rounds_to(value: str, number: str, scale: int = 1) -> bool:
    """Whether `value` (from a file) times `scale` is `number` (from a page) or the page's rounding of it; a value
    must be written at least as precisely as the page (the file's 1.7 does not give the page's 1.70)."""
    decimals = len(number.partition(".")[2])
    if scale == 1 and value == number:
        return True
    shown = len(value.partition(".")[2]) - len(str(scale)) + 1  # the value's decimals once scaled
    return shown > decimals and f"{float(value) * scale:.{decimals}f}" == number


def holds(path: Path, number: str, scales: tuple[int, ...] = (1,)) -> bool:
    """Whether `number` (as on a page: "1.72", "1,091") occurs in the file, exactly or as the page's rounding of a
    longer value (1.72 for 1.7241960; 148 for 148.3), or of a value times one of `scales` (6.6% for 0.0662)."""
    number = number.replace(",", "")
    return any(rounds_to(value, number, scale) for value in file_numbers(path) for scale in scales)


def sourced(figure: str, files: list[Path]) -> bool:
    """Whether every number of `figure` occurs in one of `files` (none named: not sourced)."""
    scales = next((scales for unit, scales in SCALES.items() if figure.endswith(unit)), (1,))
    return bool(files) and all(any(holds(path, n, scales) for path in files) for n in NUMBERS.findall(figure))


def allowances() -> dict[tuple[str, str], str]:
    """(page, figure) -> reason, from benchmarks/figure_allowances.py."""
    return {(page, figure): reason for page, figures in ALLOWED.items() for figure, reason in figures.items()}


def classify_page(page: str, text: str, allowed: dict[tuple[str, str], str] | None = None) -> list[Figure]:
    """Every figure of `page` (its text `text`) with the class that passes it ("" where none does)."""
    allowed = allowances() if allowed is None else allowed
    lines = text.splitlines()
    generated, spans = generated_lines(text), paragraphs(lines)
    chains, headers = heading_chains(lines), table_headers(lines)
    result = []
    for i, line in enumerate(lines):
        for figure in figures_on(line, line + headers[i]):
            paragraph = "\n".join(lines[slice(*context_span(i, lines, spans))])
            if i in generated:
                kind = "generated"
            elif sourced(figure, named_files(paragraph, page)):
                kind = "sourced"
            elif LABEL.search(paragraph) or LABEL.search(chains[i]):
                kind = "labelled"
            elif (page, figure) in allowed:
                kind = "allowed"
            else:
                kind = ""
            result.append(Figure(page, i + 1, figure, kind))
    return result


def problems(pages: dict[str, str] | None = None) -> list[str]:
    """One line per figure that nothing passes (page, line, figure) and per allowance that matches no figure."""
    pages = pages or {page: (REPO / page).read_text(encoding="utf-8") for page in markdown_pages()}
    found, used = [], set()
    for page, text in pages.items():
        for figure in classify_page(page, text):
            if figure.kind == "allowed":
                used.add((page, figure.text))
            elif not figure.kind:
                found.append(f"{page}:{figure.line}: the figure '{figure.text}' has no source. Fix: generate it "
                             "(benchmarks/tables.py), name the results file that holds it on its line, label it "
                             f"({', '.join(EXTERNAL + EARLIER)}), or allow it in "
                             "benchmarks/figure_allowances.py with a reason")  # fmt: skip
    for page, figure in sorted(set(allowances()) - used):
        if page in pages:
            found.append(f"{page}: the allowance for '{figure}' matches no figure left on the page. Fix: remove it "
                         "from benchmarks/figure_allowances.py")  # fmt: skip
    return found


def main() -> int:
    counts: dict[str, Counter] = {}
    for page in markdown_pages():
        figures = classify_page(page, (REPO / page).read_text(encoding="utf-8"))
        counts[page] = Counter(figure.kind or "none" for figure in figures)
    kinds = ("generated", "sourced", "labelled", "allowed", "none")
    print("| page | " + " | ".join(kinds) + " |")
    for page, count in counts.items():
        if count:
            print(f"| {page} | " + " | ".join(str(count[kind]) for kind in kinds) + " |")
    total = sum(counts.values(), Counter())
    print("| all | " + " | ".join(str(total[kind]) for kind in kinds) + " |")
    found = problems()
    for problem in found:
        print(problem, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
