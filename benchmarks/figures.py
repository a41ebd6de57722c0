#!/usr/bin/env python
"""Every measured-looking number in the repository's markdown pages is tied to where it comes from.

A figure is a number with a unit of time (`s`, `ms`, `us`, `µs`, `min`, `minutes`, `h`, `hours`, `seconds`), a ratio
(`1.7x`, `1.7×`), a percentage, a rate (`img/s`, `images/s`), a size (`KB`, `MB`, `MiB`, `GB`, `GiB`), `points`; a
`0.xx` score (3+ decimals anywhere outside code, 2 decimals next to a score word: accuracy, AUROC, F1, loss, top-1,
reached, scored); or a bare number right after "top-1" or "accuracy". Each figure must be one of:

- generated: inside a `<!-- table: name -->` block of a table benchmarks/tables.py knows (it rewrites the block from
  its results file), or in a study's report.md that recipes/scaling_study.py writes whole beside its results.csv;
- bound: followed directly by `<!-- field: <file>#<key path> -->` (invisible on GitHub), optionally with ` unit=<u>`
  before `-->`. The key path is dot-separated JSON keys, integers indexing lists (`arms.3.ratio`); for a CSV
  `<file>.csv#<column>=<value>/<column>` (the row whose column holds the value; several `col=value` joined by `&`).
  The field's unit is `unit=` or its name's suffix (FIELD_UNITS); the check converts it to the page's unit
  (s/ms/µs/min/h; fraction/%/points; x; sizes), rounds to the page's decimals and fails on any difference.
  `python benchmarks/figures.py --write` (`make docs-figures`) rewrites each bound figure from its field;
- labelled: its own sentence (a table row with its table's header row; a heading; a fenced block; a list item's
  sentence) says it is an earlier measurement with the commit (a word of EARLIER or "commit", and a 7-40 hex hash),
  or an external reference with its source (a URL, an arXiv id or an "et al." citation). A label in the paragraph
  or a heading passes nothing else;
- allowed: listed for its page in benchmarks/figure_allowances.py with a reason (not a measurement: a setting, a
  target, arithmetic). An entry that no longer matches a figure is itself reported.

`python benchmarks/tables.py --check` runs this check with the tables' (tests/repo/test_figures.py runs both);
`python benchmarks/figures.py` prints how many figures of each class each page holds and the problems.
"""

import csv
import json
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from functools import cache
from pathlib import Path

from figure_allowances import ALLOWED  # benchmarks/figure_allowances.py (scripts run as benchmarks/<name>.py)
from figure_history import unheld_commits  # benchmarks/figure_history.py: a label's commit, looked up in git

REPO = Path(__file__).resolve().parents[1]

# A measurement this project made once and kept in no results file: one of these words (or "commit") with the
# commit's hash in the figure's own sentence.
EARLIER = ("earlier measurement", "earlier run", "earlier count", "measured once", "no results file", "commit")
# A cited source outside this repository: in the figure's own sentence.
EXTERNAL = ("a URL", "an arXiv id", "et al.")

NUMBER = r"\d[\d,]*(?:\.\d+)?"
UNIT = (r"(?:\s?(?:ms|us|µs|μs|s|sec|seconds?|min|minutes?|h|hours?|img/s|images/s|KB|KiB|MB|MiB|GB|GiB|TB|points?)"
        r"(?![\w/])|\s?%|[x×](?![\w-]))")  # fmt: skip
# A figure: a number or a range of numbers ("113-152 s") with its unit, not part of a longer token (v1.2, 3e-5).
UNIT_FIGURE = re.compile(rf"(?<![\w.\-−+/])[-−+]?{NUMBER}(?:\s?(?:-|–|to)\s?[-−+]?{NUMBER})?{UNIT}")
SCORE = re.compile(r"(?<![\w.\-/])0\.\d{2,}(?![\d\w])")
LONG_SCORE = re.compile(r"(?<![\w.\-/])0\.\d{3,}(?![\d\w])")
SCORE_WORDS = re.compile(r"accurac|\bacc\b|auroc|\bauc\b|\bf1\b|loss|top-?1|reached|scored", re.I)
# "top-1 97.3", "accuracy 0.85", "Top-1: 81.8": a bare number after the word is a score.
AFTER_SCORE_WORD = re.compile(r"(?:top-?1|accuracy)(?:\s+(?:of|is|was|at))?[\s:=]+(?P<n>\d+(?:\.\d+)?)(?![\d\w.,%])",
                              re.I)  # fmt: skip
CODE_SPAN = re.compile(r"`[^`\n]*`")
MARKER = re.compile(r"<!-- field: (?P<file>[^#\s]+)#(?P<key>[^\s]+?)(?: unit=(?P<unit>[^\s]+))? -->")
GENERATED_BLOCK = re.compile(r"<!-- table: (?P<name>[\w-]+) -->\n.*?<!-- /table -->", re.S)
HASH = re.compile(r"(?<![\w/])(?:(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}|(?<=commit )[0-9a-f]{7,40})(?![\w/])")
SOURCE = re.compile(r"https?://|arxiv[: ]\s?\d{4}\.\d{4,5}|\bet al\.", re.I)
EARLIER_WORDS = re.compile("|".join(rf"(?<!\w){re.escape(word)}s?(?!\w)" for word in EARLIER), re.I)
# The end of a sentence: a stop, then a capital or an opening mark (not after "e.g.", "et al.", "vs.", a decimal).
SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)(?<!\bal)(?<!\bvs)(?<!\bcf)[.!?;](?=\s+[A-Z(\[*`_\"'])")

# A page's unit -> (family, scale to the family's base).
PAGE_UNITS = {
    "s": ("time", 1), "sec": ("time", 1), "second": ("time", 1), "seconds": ("time", 1),
    "ms": ("time", 1e-3), "us": ("time", 1e-6), "µs": ("time", 1e-6), "μs": ("time", 1e-6),
    "min": ("time", 60), "minute": ("time", 60), "minutes": ("time", 60),
    "h": ("time", 3600), "hour": ("time", 3600), "hours": ("time", 3600),
    "%": ("fraction", 0.01), "point": ("fraction", 0.01), "points": ("fraction", 0.01), "fraction": ("fraction", 1),
    "x": ("ratio", 1), "×": ("ratio", 1),
    "img/s": ("rate", 1), "images/s": ("rate", 1),
    "B": ("size", 1), "KB": ("size", 1e3), "MB": ("size", 1e6), "GB": ("size", 1e9), "TB": ("size", 1e12),
    "KiB": ("size", 2**10), "MiB": ("size", 2**20), "GiB": ("size", 2**30),
}  # fmt: skip
# A field name's ending -> its unit (first match wins: images_per_s is a rate, not seconds).
FIELD_UNITS = (
    (("_per_s", "per_second", "per_sec", "images_s"), "img/s"),
    (("_seconds", "_s", "_sec"), "s"), (("_ms",), "ms"), (("_us",), "µs"), (("_min", "_minutes"), "min"),
    (("_h", "_hours"), "h"), (("_pct", "percent"), "%"), (("fraction", "_frac"), "fraction"),
    (("ratio", "_x", "speedup"), "x"), (("_bytes",), "B"), (("_mib",), "MiB"), (("_gib",), "GiB"),
    (("_mb",), "MB"), (("_gb",), "GB"),
)  # fmt: skip


@dataclass(frozen=True)
class Figure:
    page: str  # relative to the repository
    line: int  # 1-based
    text: str  # as on the page: "148.7 s", "1.72x", "0.8473"
    kind: str = ""  # generated | bound | labelled | allowed | "" (none: a problem)
    column: int = 0  # 0-based, in the line
    marker: re.Match | None = None  # the field marker right after it
    problem: str = ""  # why a bound figure fails (its field missing or different)
    commits: tuple[str, ...] = ()  # a figure labelled by an earlier measurement: the hashes its sentence names


def markdown_pages() -> list[str]:
    """Every markdown page git tracks (a new page is checked once it is added)."""
    out = subprocess.run(["git", "ls-files", "*.md"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return sorted(out.split())


@cache
def known_tables() -> frozenset[str]:
    from table_renderers import TABLES  # benchmarks/table_renderers/: the registry benchmarks/tables.py writes

    return frozenset(TABLES)


def generated_lines(text: str) -> set[int]:
    """The 0-based line numbers inside generated blocks of known tables (markers included)."""
    lines = set()
    for match in GENERATED_BLOCK.finditer(text):
        if match.group("name") in known_tables():
            first = text.count("\n", 0, match.start())
            lines.update(range(first, first + match.group(0).count("\n") + 1))
    return lines


TABLE_OPENING = re.compile(r"^<!-- table: (?P<name>[\w-]+) -->", re.M)  # on a line of its own, as tables.py writes


def unclosed_tables(page: str, text: str) -> list[str]:
    """A `<!-- table: name -->` that no `<!-- /table -->` closes is no generated block: nothing checks its figures."""
    closed = {m.start() for m in GENERATED_BLOCK.finditer(text)}
    return [f"{page}:{text.count(chr(10), 0, m.start()) + 1}: the table marker for {m.group('name')!r} is never "
            "closed. Fix: end the block with <!-- /table --> (python benchmarks/tables.py writes it whole)"
            for m in TABLE_OPENING.finditer(text) if m.start() not in closed]  # fmt: skip


def unknown_tables(page: str, text: str) -> list[str]:
    return [f"{page}:{text.count(chr(10), 0, m.start()) + 1}: table {m.group('name')!r} is no table benchmarks/"
            f"tables.py knows, so nothing generates or checks it. Fix: one of {', '.join(sorted(known_tables()))}"
            for m in GENERATED_BLOCK.finditer(text) if m.group("name") not in known_tables()]  # fmt: skip


def is_study_report(page: str) -> bool:
    """A study's report.md, written whole with its results.csv by recipes/scaling_study.py."""
    path = REPO / page
    return page.startswith("docs/studies/") and path.name == "report.md" and (path.parent / "results.csv").is_file()


def blank(text: str, pattern: re.Pattern) -> str:
    """`text` with each match of `pattern` replaced by as many spaces (columns kept)."""
    return pattern.sub(lambda m: " " * len(m.group(0)), text)


def figures_on(line: str, context: str, code: bool = False) -> list[tuple[int, str]]:
    """The figures in `line` as (column, text): numbers with a unit, 0.xx scores (2+ decimals where `context`, the
    line and its table's header, has a score word; 3+ anywhere in prose), bare numbers after top-1 or accuracy in
    prose. In a fenced block (`code`), or a code span, only the first two."""
    line = blank(line, MARKER)
    found = [(m.start(), m.group(0)) for m in UNIT_FIGURE.finditer(line)]
    prose = line if code else blank(line, CODE_SPAN)
    if SCORE_WORDS.search(context):
        found += [(m.start(), m.group(0)) for m in SCORE.finditer(line)]
    if not code:
        found += [(m.start(), m.group(0)) for m in LONG_SCORE.finditer(prose)]
        found += [(m.start("n"), m.group("n")) for m in AFTER_SCORE_WORD.finditer(prose)]
    taken: list[range] = []
    result = []
    for start, text in sorted(found, key=lambda f: (f[0], -len(f[1]))):
        if not any(start in r for r in taken):
            taken.append(range(start, start + len(text)))
            result.append((start, text))
    return result


def sentences(lines: list[str]) -> tuple[list[list[tuple[int, int, int]]], list[str]]:
    """Per line, the sentences on it as (start column, end column, sentence id), and each sentence's text by id.
    A table row is one sentence with its table's header row; a heading is one; a fenced block is one; a paragraph
    or a list item splits at its stops."""
    per_line: list[list[tuple[int, int, int]]] = [[] for _ in lines]
    texts: list[str] = []
    header = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("|"):
            header = header or line
            per_line[i].append((0, len(line), len(texts)))
            texts.append(line + "\n" + header)
            i += 1
            continue
        header = ""
        if line.startswith("```"):  # a fenced block is one sentence: a note inside it labels its output
            j = next((k for k in range(i + 1, len(lines)) if lines[k].startswith("```")), len(lines) - 1)
            for k in range(i, j + 1):
                per_line[k].append((0, len(lines[k]), len(texts)))
            texts.append("\n".join(lines[i : j + 1]))
            i = j + 1
            continue
        if not line.strip() or line.startswith("#"):
            per_line[i].append((0, len(line), len(texts)))
            texts.append(line)
            i += 1
            continue
        # a run of prose lines up to a blank line, a table, a heading or the next list item
        j = i + 1
        while j < len(lines) and lines[j].strip() and not re.match(r"\s*(?:[-*+] |\d+\. |#|\||```)", lines[j]):
            j += 1
        joined = "\n".join(lines[i:j])
        starts = [0] + [m.end() for m in SENTENCE_END.finditer(joined)] + [len(joined) + 1]
        offsets = [sum(len(each) + 1 for each in lines[i:k]) for k in range(i, j + 1)]
        for a, b in zip(starts, starts[1:], strict=False):
            sid = len(texts)
            texts.append(joined[a:b])
            for k in range(i, j):
                lo, hi = max(a, offsets[k - i]), min(b, offsets[k - i] + len(lines[k]) + 1)
                if lo < hi:
                    per_line[k].append((lo - offsets[k - i], hi - offsets[k - i], sid))
        i = j
    return per_line, texts


def sentence_of(column: int, spans: list[tuple[int, int, int]], texts: list[str]) -> str:
    return next((texts[sid] for lo, hi, sid in spans if lo <= column < hi), texts[spans[-1][2]] if spans else "")


def labelled(sentence: str) -> bool:
    """Whether a sentence cites its source (URL, arXiv id, et al.) or names the commit of an earlier measurement."""
    return bool(SOURCE.search(sentence) or (HASH.search(sentence) and EARLIER_WORDS.search(sentence)))


def field_unit(key: str, unit: str | None) -> str | None:
    """The field's unit: its name's (the nearest key with a unit ending); a marker's `unit=` gives one to a field
    whose name has none, and must agree with the name's (a figure retyped from 70 ms to 70 s with `unit=s` added to
    its marker must not pass)."""
    own = _unit_of_name(key)
    if unit and own and unit != own:
        raise ValueError(f"unit={unit} disagrees with the field's own unit ({own}, from its name)")
    return unit or own


def _unit_of_name(key: str) -> str | None:
    names = [key.rpartition("/")[2]] if "=" in key else key.split(".")  # a CSV's column; a JSON path's keys
    for name in reversed([name.lower() for name in names]):  # the nearest with a unit: median_step_ms.with is ms
        unit = next((u for endings, u in FIELD_UNITS if name.endswith(endings)), None)
        if unit:
            return unit
    return None


@cache
def load(path: str):
    file = REPO / path
    if path.endswith(".csv"):
        with open(file, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    return json.loads(file.read_text(encoding="utf-8"))


def lookup(data, keys: list[str]):
    """The value at `keys` (dot-split; a key that itself holds dots is matched whole, the longest first)."""
    if not keys:
        return data
    for n in range(len(keys), 0, -1):
        key = ".".join(keys[:n])
        if isinstance(data, dict) and key in data:
            return lookup(data[key], keys[n:])
        if isinstance(data, list) and n == 1 and re.fullmatch(r"-?\d+", key) and -len(data) <= int(key) < len(data):
            return lookup(data[int(key)], keys[1:])
    raise KeyError("no such key")


def field_value(file: str, key: str) -> float:
    """The number a marker names; KeyError/ValueError/OSError with why it is not there."""
    if not (REPO / file).is_file():
        raise OSError(f"{file} does not exist")
    data = load(file)
    if file.endswith(".csv"):
        where, _, column = key.rpartition("/")
        conditions = [c.partition("=") for c in where.split("&")] if where else []
        rows = [r for r in data if all(r.get(c) == v for c, _, v in conditions)]
        if len(rows) != 1:
            raise KeyError(f"{where or 'no condition'} selects {len(rows)} rows, not 1")
        if column not in rows[0]:
            raise KeyError(f"no column {column}")
        value = rows[0][column]
    else:
        value = lookup(data, key.split("."))
    try:
        if isinstance(value, bool):
            raise TypeError
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"holds {json.dumps(value)[:40]}, not a number") from None


FIGURE_PARTS = re.compile(r"^(?P<sign>[-−+]?)(?P<number>\d[\d,]*(?:\.\d+)?)(?P<unit>.*)$", re.S)


def expected_number(figure: str, value: float, funit: str | None) -> str:
    """The figure's number as `value` (in `funit`) gives it in the page's unit and decimals; ValueError if the units
    do not convert."""
    parts = FIGURE_PARTS.match(figure)
    if not parts or re.search(r"\d\s?(?:-|–|to)\s?[-−+]?\d", figure):
        raise ValueError("a bound figure is one number (bind each end of a range)")
    unit = parts.group("unit").strip()
    page = PAGE_UNITS.get(unit)
    field = PAGE_UNITS.get(funit) if funit else None
    if funit and not field:
        raise ValueError(f"unit={funit} is no unit the check knows ({', '.join(PAGE_UNITS)})")
    if page and page[0] == "time" and not field:
        raise ValueError("the field's name gives no unit and the page's figure is a time. Fix: add unit=<u>")
    if page and field:
        if page[0] != field[0]:
            raise ValueError(f"the field is in {funit}, the page in {unit}")
        value = value * field[1] / page[1]
    decimals = len(parts.group("number").partition(".")[2])
    shown = Decimal(repr(abs(value))).quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP)
    text = f"{shown:,.{decimals}f}" if "," in parts.group("number") or shown >= 10_000 else f"{shown:.{decimals}f}"
    if value < 0 and shown != 0:
        text = ("-" if parts.group("sign") == "-" else "−") + text
    elif parts.group("sign") == "+":
        text = "+" + text
    return text


def check_bound(figure: str, marker: re.Match) -> tuple[str, str]:
    """(the figure as its field gives it, "" or why the field cannot give it)."""
    file, key = marker.group("file"), marker.group("key")
    try:
        value = field_value(file, key)
        shown = expected_number(figure, value, field_unit(key, marker.group("unit")))
    except (OSError, KeyError, ValueError) as error:
        return figure, f"{file}#{key}: {str(error).strip(chr(39))}"
    parts = FIGURE_PARTS.match(figure)
    return shown + parts.group("unit"), ""


def allowances() -> dict[tuple[str, str], str]:
    """(page, figure) -> reason, from benchmarks/figure_allowances.py."""
    return {(page, figure): reason for page, figures in ALLOWED.items() for figure, reason in figures.items()}


def classify_page(page: str, text: str, allowed: dict[tuple[str, str], str] | None = None) -> list[Figure]:
    """Every figure of `page` (its text `text`) with the class that passes it ("" where none does)."""
    allowed = allowances() if allowed is None else allowed
    lines = text.splitlines()
    generated = generated_lines(text)
    per_line, texts = sentences(lines)
    headers, header = [], ""
    for line in lines:
        header = (header or line) if line.startswith("|") else ""
        headers.append(header)
    report = is_study_report(page)
    result, fenced = [], False
    for i, line in enumerate(lines):
        fenced = fenced != line.startswith("```")
        for column, figure in figures_on(line, line + headers[i], code=fenced or line.startswith("```")):
            marker = MARKER.match(line, column + len(figure) + (line[column + len(figure) : column + len(figure) + 1]
                                                                == " "))  # fmt: skip
            problem = ""
            if marker and fenced:
                kind, problem = "bound", "a marker inside a code block, where GitHub shows it: bind it in prose"
            elif marker:
                kind = "bound"
                shown, problem = check_bound(figure, marker)
                if not problem and shown != figure:
                    problem = f"{marker.group('file')}#{marker.group('key')} gives {shown}"
            elif i in generated or report:
                kind = "generated"
            elif labelled(sentence := sentence_of(column, per_line[i], texts)):
                kind = "labelled"
                commits = () if SOURCE.search(sentence) else tuple(HASH.findall(sentence))
            elif (page, figure) in allowed:
                kind = "allowed"
            else:
                kind = ""
            result.append(Figure(page, i + 1, figure, kind, column, marker, problem, commits if kind == "labelled"
                                 else ()))  # fmt: skip
    return result


def problems(pages: dict[str, str] | None = None) -> list[str]:
    """One line per figure that nothing passes or whose field differs (page, line, figure, file and field), per
    marker naming no field, per unknown table name, and per allowance that matches no figure."""
    pages = pages or {page: (REPO / page).read_text(encoding="utf-8") for page in markdown_pages()}
    found, used = [], set()
    labelled_by_commit = []
    for page, text in pages.items():
        found += unknown_tables(page, text) + unclosed_tables(page, text)
        classified = classify_page(page, text)
        labelled_by_commit += [figure for figure in classified if figure.commits]
        for figure in classified:
            if figure.kind == "allowed":
                used.add((page, figure.text))
            elif figure.problem:
                found.append(f"{page}:{figure.line}: the figure '{figure.text}' is bound to {figure.problem}. "
                             "Fix: python benchmarks/figures.py --write, or bind it to its field")  # fmt: skip
            elif not figure.kind:
                found.append(f"{page}:{figure.line}: the figure '{figure.text}' has no source. Fix: bind it "
                             "(<!-- field: <file>#<key> --> right after it), generate it (benchmarks/tables.py), "
                             "say in its own sentence the commit of the earlier measurement or the external source "
                             "(URL, arXiv id, et al.), or allow it in benchmarks/figure_allowances.py with a "
                             "reason")  # fmt: skip
        lines = text.splitlines()
        bound = {(f.line, f.marker.start()) for f in classified if f.marker}
        for i, line in enumerate(lines):
            for marker in MARKER.finditer(line):
                if (i + 1, marker.start()) not in bound:
                    found.append(f"{page}:{i + 1}: the marker for {marker.group('file')}#{marker.group('key')} "
                                 "follows no figure. Fix: put it right after the figure it binds")  # fmt: skip
    found += unheld_commits(labelled_by_commit, lambda text: FIGURE_PARTS.match(text).group("number"))
    for page, figure in sorted(set(allowances()) - used):
        if page in pages:
            found.append(f"{page}: the allowance for '{figure}' matches no figure left on the page. Fix: remove it "
                         "from benchmarks/figure_allowances.py")  # fmt: skip
    return found


def rewritten(page: str, text: str) -> str:
    """`text` with every bound figure rewritten from its field (the page's unit and decimals kept)."""
    lines = text.splitlines(keepends=True)
    for figure in sorted(classify_page(page, text), key=lambda f: -f.column):
        if figure.marker:
            shown, problem = check_bound(figure.text, figure.marker)
            if not problem:
                line = lines[figure.line - 1]
                lines[figure.line - 1] = line[: figure.column] + shown + line[figure.column + len(figure.text) :]
    return "".join(lines)


KINDS = ("generated", "bound", "labelled", "allowed", "none")


@cache
def page_counts(page: str, text: str) -> Counter:
    return Counter(figure.kind or "none" for figure in classify_page(page, text))


def census() -> dict[str, Counter]:
    """Per page holding figures, how many of each class (`KINDS`)."""
    counts = {page: page_counts(page, (REPO / page).read_text(encoding="utf-8")) for page in markdown_pages()}
    return {page: count for page, count in counts.items() if count}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--write"]:
        for page in markdown_pages():
            path = REPO / page
            text = path.read_text(encoding="utf-8")
            new = rewritten(page, text)
            if new != text:
                path.write_text(new, encoding="utf-8")
                print(f"rewrote {page}")
        return 0
    if argv:
        print("usage: python benchmarks/figures.py [--write]", file=sys.stderr)
        return 2
    counts = census()
    print("| page | " + " | ".join(KINDS) + " |")
    for page, count in counts.items():
        print(f"| {page} | " + " | ".join(str(count[kind]) for kind in KINDS) + " |")
    total = sum(counts.values(), Counter())
    print("| all | " + " | ".join(str(total[kind]) for kind in KINDS) + " |")
    found = problems()
    for problem in found:
        print(problem, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
