"""The pages' measured figures: generated tables equal their results files, and every results section names its
source (benchmarks/tables.py, `make docs-figures`)."""

import importlib.util
import re
import sys

import pytest

from tests.helpers.launchers import REPO

sys.path.insert(0, str(REPO / "benchmarks"))  # as when run as a script: tables.py imports table_renderers beside it
spec = importlib.util.spec_from_file_location("tables", REPO / "benchmarks" / "tables.py")
tables = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tables)

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


def test_every_generated_table_and_results_section_is_current_and_sourced():
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


def test_a_results_section_with_figures_needs_a_source():
    assert tables.unsourced_sections("## What was measured\n\nA step took 75 ms.\n") == ["What was measured"]
    assert tables.unsourced_sections("## What was measured\n\nA step took 75 ms (results/x.json).\n") == []
    assert tables.unsourced_sections("## Results\n\nNo numbers here.\n") == []
    assert tables.unsourced_sections("## Usage\n\nA step took 75 ms.\n") == []  # not a results section


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
