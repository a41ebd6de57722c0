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
