"""The pages' measured figures: generated tables equal their results files, and every figure typed in a markdown page
is sourced, labelled or allowed (benchmarks/tables.py, benchmarks/figures.py, `make docs-figures`)."""

import importlib.util
import re
import sys

import pytest

from tests.helpers.launchers import REPO

sys.path.insert(0, str(REPO / "benchmarks"))  # as when run as a script: tables.py imports table_renderers beside it
spec = importlib.util.spec_from_file_location("tables", REPO / "benchmarks" / "tables.py")
tables = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tables)
figures = tables.figures

# The generated tables and the page each lives on.
GENERATED = {
    "benchmarks/README.md": ["callback_overhead", "stop_on_signal", "input_path", "input_path_auto", "imagenet_shaped",
                             "variable_size_accuracy", "synthetic_floor", "hetero_balance", "sequence_parallel_cpu",
                             "sequence_parallel_cpu_run2", "regularization_cost", "host_path_regularization",
                             "planner_memory_by_engine"],
    "docs/planner.md": ["planner_memory_rows", "planner_study"],
}  # fmt: skip
# A figure in a table cell: the first number right after a cell's opening bar.
CELL_FIGURE = re.compile(r"(?<=\| )\d[\d,]*(\.\d+)?")


def test_every_generated_table_is_current_and_every_typed_figure_passes():
    assert tables.problems() == []


@pytest.mark.parametrize("page", sorted(GENERATED))
def test_the_pages_hold_generated_tables(page):
    text = (REPO / page).read_text(encoding="utf-8")
    assert set(GENERATED[page]) <= {m.group("name") for m in tables.BLOCK.finditer(text)}


@pytest.mark.parametrize(("page", "name"), [(page, name) for page, names in GENERATED.items() for name in names])
def test_one_changed_number_in_a_generated_table_is_found(page, name):
    """The contrast: the page as it is passes; with one figure typed differently (the last digit of the first number
    in a table cell), its table is named."""
    path = REPO / page
    text = path.read_text(encoding="utf-8")
    assert tables.stale_tables(text, path) == []
    block = next(m for m in tables.BLOCK.finditer(text) if m.group("name") == name)
    figure = CELL_FIGURE.search(text, block.start("body"), block.end("body"))
    number = figure.group(0)
    typed = number[:-1] + str((int(number[-1]) + 1) % 10)
    changed = text[: figure.start()] + typed + text[figure.end() :]
    assert tables.stale_tables(changed, path) == [name]


def text_of(page: str) -> str:
    return (REPO / page).read_text(encoding="utf-8")


def after_line(text: str, line: str, inserted: str) -> str:
    """`text` with the paragraph `inserted` right after its first line equal to `line`."""
    lines = text.splitlines(keepends=True)
    at = next(i for i, each in enumerate(lines) if each.rstrip("\n") == line) + 1
    return "".join(lines[:at] + ["\n", inserted + "\n"] + lines[at:])


def without_make_train_block(text: str) -> str:
    """README with its generated make_train block replaced by the same time typed as a sentence."""
    block = next(m for m in tables.BLOCK.finditer(text) if m.group("name") == "make_train")
    return text[: block.start()] + "`make train` took 3.9 min on a fresh clone.\n" + text[block.end() :]


# A figure typed into a page, one case per way the earlier check let one through: (page, the page's text with the
# figure, the figures the check must name).
INSERTED = {
    "medical results": ("recipes/medical_brain_mri/README.md",
                        lambda t: after_line(t, "## Results", "A longer run took 42 min and AUROC 0.991."),
                        ["42 min", "0.991"]),
    "reliability measured": ("docs/reliability.md",
                             lambda t: after_line(t, "## What was measured", "A resumed run lost 12 s."),
                             ["12 s"]),
    "README ratio": ("README.md", lambda t: after_line(t, "## Fast input path", "Prepared shards are 55.2x faster."),
                     ["55.2x"]),
    "new results section": ("docs/gpu.md", lambda t: t + "\n## Results\n\nMFU 61.3%, 2.4x, accuracy 0.991.\n",
                            ["61.3%", "2.4x", "0.991"]),
    "make_train retyped": ("README.md", without_make_train_block, ["3.9 min"]),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(INSERTED))
def test_a_typed_figure_inserted_into_a_page_is_named_with_its_page_and_line(case):
    """Fails if the check misses any of these figures (a unit followed by a space, a bare score, a page or section
    it does not read, a source named for the paragraph that does not hold the number) or names the wrong line."""
    page, insert, expected = INSERTED[case]
    assert figures.problems({page: text_of(page)}) == []
    text = insert(text_of(page))
    found = figures.problems({page: text})
    named = {(p.split(":")[1], p.split("'")[1]) for p in found}
    lines = text.splitlines()
    assert named == {(str(next(i + 1 for i, line in enumerate(lines) if figure in line)), figure)
                     for figure in expected}, found  # fmt: skip


PAGE = "docs/example.md"


def problems_of(text: str) -> list[str]:
    return figures.problems({PAGE: text})


def test_a_figure_passes_only_where_the_named_file_holds_its_number_up_to_the_page_s_rounding():
    """Fails if a named file passes a number it does not hold, if rounding is not allowed, or if a name that is no
    file (throughput.json) counts as a source."""
    results = "benchmarks/results/stop_on_signal.json"  # holds the ratio 1.0247... and a median of 71.39... ms
    ratio = next(v for v in figures.file_numbers(REPO / results) if v.startswith("1.02") and len(v) > 5)
    assert problems_of(f"A ratio of {ratio[:4]}x ({results}).\n") == []
    assert problems_of(f"A ratio of {ratio[:4]}x (`stop_on_signal.json`).\n") == []
    assert problems_of(f"A ratio of 1.09x ({results}).\n") != []
    assert problems_of(f"A ratio of {ratio[:4]}x (throughput.json).\n") != []
    assert problems_of(f"A ratio of {ratio[:4]}x.\n\nSource: {results}.\n") != []  # another paragraph


def test_a_number_in_scientific_notation_is_one_value_and_a_page_s_us_or_ms_may_be_its_seconds(tmp_path):
    """Fails if a file's 6.149e-06 is read as the numbers 6.149 and 06 (so that a page's "6.1 ms" or a bare 6.149
    passed by its mantissa), or if a page's µs or ms stops being matched against the file's seconds. A commit's
    hex ("5e999999") stays no number in scientific notation."""
    results = tmp_path / "callback.json"
    results.write_text('{"seconds_per_step": 6.149e-06, "median_s": 0.07139, "commit": "a5e999999b"}\n')
    assert "0.000006149" in figures.file_numbers(results)
    assert "6.149" not in figures.file_numbers(results)
    assert figures.sourced("6.1 µs", [results]) and figures.sourced("71.4 ms", [results])
    assert not figures.sourced("6.1 ms", [results]) and not figures.sourced("6.149x", [results])
    assert not figures.sourced("6 s", [results])  # 6.149e-06 s is no 6 s


def test_a_label_passes_its_paragraph_and_its_section_only():
    """Fails if a label word stops counting, or if it passes figures outside its paragraph or section."""
    assert problems_of("It took 42 min (an earlier measurement).\n") == []
    assert problems_of("## Earlier runs\n\nIt took 42 min.\n") == []
    assert problems_of("The paper (arXiv 2010.11929) reports 88.55% top-1.\n") == []
    assert problems_of("## Earlier runs\n\nx\n\n## Now\n\nIt took 42 min.\n") != []
    assert problems_of("It took 42 min.\n\nAn earlier measurement gave more.\n") != []


def test_an_allowance_passes_its_figure_on_its_page_and_one_that_matches_nothing_is_reported():
    """Fails if allowances are not read, pass figures on other pages, or stay on the list once their figure left."""
    (page, figure), reason = next(iter(figures.allowances().items()))
    assert reason.strip()
    assert f"'{figure}'" not in "".join(figures.problems({page: f"It is {figure}.\n"}))
    assert f"'{figure}'" in "".join(figures.problems({PAGE: f"It is {figure}.\n"}))
    assert any("matches no figure" in p and f"'{figure}'" in p for p in figures.problems({page: "Nothing.\n"}))


def test_the_figure_census_exits_non_zero_and_names_a_figure_nothing_passes(tmp_path, monkeypatch, capsys):
    """`python benchmarks/figures.py` (the per-page census) fails with the problem lines, as `tables.py --check`
    does; it exited 0 whatever it found."""
    (tmp_path / "docs").mkdir()
    (tmp_path / PAGE).write_text("It took 42 min.\n")
    monkeypatch.setattr(figures, "REPO", tmp_path)
    monkeypatch.setattr(figures, "markdown_pages", lambda: [PAGE])
    assert figures.main() == 1
    assert f"{PAGE}:1: the figure '42 min' has no source" in capsys.readouterr().err
    (tmp_path / PAGE).write_text("It took 42 min (an earlier measurement).\n")
    assert figures.main() == 0


def test_the_label_words_are_the_ones_benchmarks_readme_documents():
    """Fails if a label word is added to or dropped from benchmarks/figures.py without the rule's text saying so."""
    text = (REPO / "benchmarks" / "README.md").read_text(encoding="utf-8")
    rule = text[text.index("**Figures in the pages.**") :].split("\n\n")[0]
    words = {word for word in figures.EXTERNAL + figures.EARLIER if not word.startswith("http")}
    assert words <= set(re.findall(r"`([^`]+)`", rule)) and "a URL" in rule


def durations(*lines: str) -> dict:
    return {"output_tail": ["=== slowest 25 durations ===", *lines, "3 passed in 400.00s (0:06:40)"]}


def test_the_slowest_tests_table_sums_per_file_and_gives_each_file_its_reason():
    result = durations(
        "100.50s setup    tests/launched/test_conformance.py::test_a[ddp]",
        "30.00s call     tests/launched/test_slurm.py::test_b",
        "20.25s call     tests/launched/test_conformance.py::test_c",
    )
    rows = tables.renderers.slowest_tests(result).splitlines()[2:]
    assert [row.split(" | ")[:2] for row in rows] == [["| `test_conformance.py` (2)", "121"],
                                                      ["| `test_slurm.py` (1)", "30"]]  # fmt: skip
    assert tables.renderers.SLOW_BECAUSE["test_conformance.py"] in rows[0]


def test_a_slow_test_file_without_a_reason_stops_the_generation_and_is_named():
    result = durations("300.00s call     tests/launched/test_new_and_slow.py::test_x")
    with pytest.raises(SystemExit, match="test_new_and_slow.py among the slowest tests without a reason"):
        tables.renderers.slowest_tests(result)


def test_a_timed_test_run_shows_pytest_s_own_summary():
    result = {**durations(), "timed": "make test", "where": "a fresh clone", "wall_s": 1236.0, "wall_min": 20.6,
              "exit_code": 0}  # fmt: skip
    assert "| 3 passed in 400.00s (0:06:40) |" in tables.renderers.timed_command(result)
