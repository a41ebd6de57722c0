"""The pages' measured figures: generated tables equal their results files, and every results section names its
source (benchmarks/tables.py, `make docs-figures`)."""

import importlib.util
import re

import pytest

from tests.helpers.launchers import REPO

spec = importlib.util.spec_from_file_location("tables", REPO / "benchmarks" / "tables.py")
tables = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tables)

PAGE = REPO / "benchmarks" / "README.md"


def test_every_generated_table_and_results_section_is_current_and_sourced():
    assert tables.problems() == []


def test_the_pages_hold_generated_tables():
    text = PAGE.read_text(encoding="utf-8")
    assert {"callback_overhead", "stop_on_signal"} <= {m.group("name") for m in tables.BLOCK.finditer(text)}


@pytest.mark.parametrize("name", ["callback_overhead", "stop_on_signal"])
def test_one_changed_number_in_a_generated_table_is_found(name):
    """The contrast: the page as it is passes; with one figure typed differently (the last digit of the table's
    first decimal number), its table is named."""
    text = PAGE.read_text(encoding="utf-8")
    assert tables.stale_tables(text, PAGE) == []
    block = next(m for m in tables.BLOCK.finditer(text) if m.group("name") == name)
    number = re.search(r"\d+\.\d+", block.group("body")).group(0)
    typed = number[:-1] + str((int(number[-1]) + 1) % 10)
    changed = text[: block.start()] + block.group(0).replace(number, typed, 1) + text[block.end() :]
    assert tables.stale_tables(changed, PAGE) == [name]


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
    rows = tables.slowest_tests(result).splitlines()[2:]
    assert [row.split(" | ")[:2] for row in rows] == [["| `test_conformance.py` (2)", "121"],
                                                      ["| `test_slurm.py` (1)", "30"]]  # fmt: skip
    assert tables.SLOW_BECAUSE["test_conformance.py"] in rows[0]


def test_a_slow_test_file_without_a_reason_stops_the_generation_and_is_named():
    result = durations("300.00s call     tests/launched/test_new_and_slow.py::test_x")
    with pytest.raises(SystemExit, match="test_new_and_slow.py among the slowest tests without a reason"):
        tables.slowest_tests(result)


def test_a_timed_test_run_shows_pytest_s_own_summary():
    result = {**durations(), "timed": "make test", "where": "a fresh clone", "wall_s": 1236.0, "wall_min": 20.6,
              "exit_code": 0}  # fmt: skip
    assert "| 3 passed in 400.00s (0:06:40) |" in tables.timed_command(result)
