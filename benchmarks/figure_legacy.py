"""The paragraph rule benchmarks/figures.py applied before figures were bound, kept for the pages listed in
`figure_allowances.PENDING` until each of their figures is bound or labelled in its own sentence: a figure passes
when its paragraph (a table: with the paragraphs just before and after it) or a heading above it carries a label
word, or names a results file holding its number up to the page's rounding. Delete this module with the last
pending page."""

import re
from decimal import Decimal
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
WORDS = ("arXiv", "paper", "et al.", "for reference", "reference figure", "datasheet", "http://", "https://",
         "earlier measurement", "earlier run", "earlier count", "measured once", "no results file")  # fmt: skip
LABEL = re.compile("|".join(rf"(?<!\w){re.escape(word)}s?(?!\w)" if word[-1].isalpha() else re.escape(word)
                            for word in WORDS), re.I)  # fmt: skip
NUMBERS = re.compile(r"\d[\d,]*(?:\.\d+)?")
FILE_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?[eE][-+]?\d{1,3}(?![\w.])|\d+(?:\.\d+)?")
SCALES = {"%": (1, 100), "ms": (1, 1_000), "us": (1, 1_000_000), "µs": (1, 1_000_000), "μs": (1, 1_000_000)}
NAMED_FILE = re.compile(r"[\w./-]*[\w-]+\.(?:json|csv)\b")
NAMED_STUDY = re.compile(r"(?:docs/)?studies/[\w/.-]*\w")


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


@cache
def page_context(text: str) -> tuple[list[str], list[tuple[int, int]], list[str]]:
    lines = text.splitlines()
    return lines, paragraphs(lines), heading_chains(lines)


def passes(page: str, text: str, i: int, figure: str) -> bool:
    """Whether the figure `figure` on line `i` (0-based) of `page` (its text `text`) passes the paragraph rule."""
    lines, spans, chains = page_context(text)
    paragraph = "\n".join(lines[slice(*context_span(i, lines, spans))])
    chain = chains[i]
    return sourced(figure, named_files(paragraph, page)) or bool(LABEL.search(paragraph) or LABEL.search(chain))
