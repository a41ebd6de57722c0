"""The pages' measured figures: generated tables equal their results files, and every figure typed in a markdown page
is bound to its field and equal to it, labelled in its own sentence, or allowed (benchmarks/tables.py,
benchmarks/figures.py, `make docs-figures`)."""

import importlib.util
import re
import sys

import pytest

from tests.helpers.launchers import REPO, read_json

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
    before = tables.stale_tables(text, path)  # figure_counts is stale while another page's figures change
    assert name not in before
    block = next(m for m in tables.BLOCK.finditer(text) if m.group("name") == name)
    figure = CELL_FIGURE.search(text, block.start("body"), block.end("body"))
    number = figure.group(0)
    typed = number[:-1] + str((int(number[-1]) + 1) % 10)
    changed = text[: figure.start()] + typed + text[figure.end() :]
    assert set(tables.stale_tables(changed, path)) == {name, *before}


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


STOP = "benchmarks/results/stop_on_signal.json"  # flag_all_reduce_us 146.7; steps 100; torch "2.13.0+cpu"; date
MAKE_TEST = "benchmarks/results/make_test.json"
# Its wall time, read here: the file is rewritten each time make test is timed.
WALL_S = read_json(REPO / MAKE_TEST)["wall_s"]


def field(path: str, key: str, unit: str = "") -> str:
    return f"<!-- field: {path}#{key}{f' unit={unit}' if unit else ''} -->"


# Each edit the paragraph-scoped, any-number-in-the-file check passed: (the page's text, then per problem the line,
# the figure and what else the line must name: the field, or the table).
LOOPHOLES = {
    "paragraph label": ("An earlier run at commit 7da47a9 took 40 min, and the earlier runs were slower.\n"
                        "This run reached 0.9931 accuracy.\n", [(2, "0.9931", "has no source")]),
    "link in the paragraph": ("The method is at https://example.com/vit. Our run took 42 min.\n",
                              [(1, "42 min", "has no source")]),
    "not a paper": ("This is not a paper: the run took 42 min.\n", [(1, "42 min", "has no source")]),
    "a field of another name and unit": (f"Flagging costs 146.7 ms{field(STOP, 'flag_all_reduce_us')} a step.\n",
                                         [(1, "146.7 ms", f"{STOP}#flag_all_reduce_us gives 0.1 ms")]),
    "seconds typed as ms": (f"`make test` took {round(WALL_S):,} ms{field(MAKE_TEST, 'wall_s')}.\n",
                            [(1, f"{round(WALL_S):,} ms", f"{MAKE_TEST}#wall_s gives {WALL_S * 1000:,.0f} ms")]),
    "steps typed as seconds": (f"It ran 100 s{field(STOP, 'setup.steps')}.\n",
                               [(1, "100 s", f"{STOP}#setup.steps: the field's name gives no unit")]),
    "version digits": (f"It took 2.1 s{field(STOP, 'setup.torch', 's')}.\n",
                       [(1, "2.1 s", f"{STOP}#setup.torch: holds \"2.13.0+cpu\", not a number")]),
    "version digits, file named": (f"It took 2.1 s ({STOP}).\n", [(1, "2.1 s", "has no source")]),
    "date digits": (f"It took 4 min{field(STOP, 'provenance.date', 'min')}.\n",
                    [(1, "4 min", f"{STOP}#provenance.date: holds \"2026-12-04\", not a number")]),
    "a key that is not there": (f"It took 4 min{field(STOP, 'provenance.minutes')}.\n",
                                [(1, "4 min", f"{STOP}#provenance.minutes: no such key")]),
    "a file that is not there": (f"It took 4 min{field('benchmarks/results/none.json', 'wall_min')}.\n",
                                 [(1, "4 min", "benchmarks/results/none.json#wall_min: benchmarks/results/none.json "
                                                "does not exist")]),
    "unknown table name": ("<!-- table: notes -->\n| run | time |\n|---|---|\n| a | 42 min |\n<!-- /table -->\n",
                           [(1, "", "table 'notes' is no table"), (4, "42 min", "has no source")]),
    "unlabelled score": ("The model reached 0.9931 on the test set.\n", [(1, "0.9931", "has no source")]),
    "top-1 without a percent sign": ("Top-1 97.3 after 300 epochs.\n", [(1, "97.3", "has no source")]),
    "a label in the caption, not the row": ("Earlier runs (commit 7da47a9):\n\n| run | top-1 |\n|---|---|\n"
                                            "| a | 0.8473 |\n", [(5, "0.8473", "has no source")]),
    # A made-up hash: the commit is looked up in git's history.
    "a commit git does not know": ("An earlier run reached 0.9912 (commit 1a2b3c4).\n",
                                   [(1, "0.9912", "names commit 1a2b3c4, which is not in this repository")]),
    # A real commit that neither holds the figure nor is named where it was added (bb41ce6: a review of code).
    "a commit that holds no such figure": ("An earlier run reached 0.9912 (commit bb41ce6).\n",
                                           [(1, "0.9912", "names commit bb41ce6, which neither holds 0.9912")]),
    # 70 ms retyped as 70 s, the marker given unit=s: the field's own unit (its name's _ms) wins.
    "a marker's unit against its field's": (f"A step took 70 s{field(STOP, 'median_step_ms.without', 's')}.\n",
                                            [(1, "70 s", "unit=s disagrees with the field's own unit (ms")]),
    "a table marker never closed": ("<!-- table: nosuch -->\n| run | time |\n|---|---|\n",
                                    [(1, "", "the table marker for 'nosuch' is never closed")]),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(LOOPHOLES))
def test_each_way_a_figure_passed_unsourced_is_named_with_its_line_and_field(case):
    """Fails if the check passes the figure (a label elsewhere in its paragraph, a link, "not a paper", a field of
    another meaning or unit, a field that is no number, an unknown table, a score without a score word) or names the
    wrong line or field."""
    text, expected = LOOPHOLES[case]
    found = problems_of(text)
    assert len(found) == len(expected), found
    ordered = sorted(found, key=lambda p: int(p.split(":")[1]))
    for (line, figure, names), problem in zip(expected, ordered, strict=True):
        assert problem.startswith(f"{PAGE}:{line}: "), problem
        assert (not figure or f"'{figure}'" in problem) and names in problem, problem


def test_the_compile_check_fails_when_dynamo_s_plain_eager_ran_instead_of_aot_eager():
    """tests/launched/test_compile.py checked the backend's name the report echoes: swapped for dynamo's plain
    `eager`, it passed. Its check now reads what ran (AOTAutograd's graphs): in process, each backend on a tiny
    function, the counts the compile probe records."""
    import torch
    from torch._dynamo.utils import counters

    from tests.helpers.compile_checks import aot_autograd_graphs, assert_aot_eager_ran

    x = torch.randn(4, requires_grad=True)
    for backend, ran in (("aot_eager", True), ("eager", False)):
        counters.clear()
        torch._dynamo.reset()
        torch.compile(lambda t: (t * 2).sin().sum(), backend=backend)(x).backward()
        probe = {"aot_autograd_graphs": aot_autograd_graphs()}
        if ran:
            assert_aot_eager_ran(probe, model_graphs=1)
        else:
            with pytest.raises(AssertionError, match="the backend that ran is not aot_eager"):
                assert_aot_eager_ran(probe, model_graphs=1)


def test_a_bound_figure_passes_at_the_page_s_rounding_and_unit():
    """Fails if a correctly bound figure is refused: rounding to the page's decimals, ms from a field in ms under a
    key without a unit (median_step_ms.with), minutes from seconds, a percentage from a fraction."""
    assert problems_of(f"A step took 71.4 ms{field(STOP, 'median_step_ms.with')}.\n") == []
    assert problems_of(f"A step took 71 ms{field(STOP, 'median_step_ms.with')}.\n") == []
    assert problems_of(f"It took {WALL_S / 60:.1f} min{field(MAKE_TEST, 'wall_s')}.\n") == []
    assert problems_of(f"It took {WALL_S:,.1f} s{field(MAKE_TEST, 'wall_s')}.\n") == []
    assert problems_of(f"The flag is 0.21%{field(STOP, 'flag_share_of_step', 'fraction')} of a step.\n") == []
    assert problems_of(f"The ratio is 1.02x{field(STOP, 'ratio_with_over_without')}.\n") == []
    assert problems_of(f"Rank 0 took 72.4 ms{field(STOP, 'median_step_ms_per_run.with.0', 'ms')}.\n") == []


def test_a_study_csv_row_is_selected_by_its_column(tmp_path, monkeypatch):
    """Fails if a CSV field is not read from the row its condition selects, or a condition selecting no row or
    several passes."""
    monkeypatch.setattr(figures, "REPO", tmp_path)
    figures.load.cache_clear()
    (tmp_path / "r.csv").write_text("cell,n,images_per_s\na,1,900.4\nb,2,1108.4\nc,2,12\n")
    assert problems_of(f"It ran 1,108 images/s{field('r.csv', 'cell=b/images_per_s')}.\n") == []
    assert problems_of(f"It ran 1,108 images/s{field('r.csv', 'cell=b&n=2/images_per_s')}.\n") == []
    assert "selects 2 rows" in "".join(problems_of(f"It ran 12 images/s{field('r.csv', 'n=2/images_per_s')}.\n"))
    figures.load.cache_clear()


def test_a_stale_bound_figure_fails_and_write_rewrites_it_from_its_field():
    """Fails if a figure whose field changed passes, or if --write does not give it the field's value in the page's
    unit and decimals (and leaves the rest of the page alone)."""
    bound = f"80.1 ms{field(STOP, 'median_step_ms.with')}"
    stale = f"Intro 42 min (earlier run, commit 7da47a9).\n\nA step took {bound}.\n"
    found = problems_of(stale)
    assert len(found) == 1 and found[0].startswith(f"{PAGE}:3: the figure '80.1 ms' is bound to {STOP}"), found
    assert "gives 71.4 ms" in found[0]
    fixed = figures.rewritten(PAGE, stale)
    assert fixed == stale.replace("80.1 ms", "71.4 ms")
    assert problems_of(fixed) == []


def test_a_marker_inside_a_fenced_block_is_refused():
    """Fails if a marker GitHub would show (inside a code block) passes its figure."""
    found = problems_of(f"```\nmake test  # 17.6 min{field(MAKE_TEST, 'wall_min')}\n```\n")
    assert len(found) == 1 and "inside a code block" in found[0], found


def test_write_rewrites_only_the_pages_whose_bound_figures_changed(tmp_path, monkeypatch, capsys):
    """Fails if `figures.py --write` leaves a stale bound figure, or writes a page it did not change (other pages
    may be edited at the same time)."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "r.json").write_text('{"wall_s": 61.2}\n')
    stale, current = tmp_path / "docs" / "a.md", tmp_path / "docs" / "b.md"
    stale.write_text(f"It took 1.1 min{field('r.json', 'wall_s')}.\n")
    current.write_text(f"It took 1.0 min{field('r.json', 'wall_s')}.\n")
    before = current.stat().st_mtime_ns
    monkeypatch.setattr(figures, "REPO", tmp_path)
    monkeypatch.setattr(figures, "markdown_pages", lambda: ["docs/a.md", "docs/b.md"])
    figures.load.cache_clear()
    assert figures.main(["--write"]) == 0
    figures.load.cache_clear()
    assert stale.read_text() == f"It took 1.0 min{field('r.json', 'wall_s')}.\n"
    assert current.stat().st_mtime_ns == before and capsys.readouterr().out == "rewrote docs/a.md\n"


def test_a_marker_after_no_figure_is_reported():
    assert "follows no figure" in "".join(problems_of(f"The step{field(STOP, 'median_step_ms.with')} was short.\n"))


def test_a_label_passes_its_own_sentence_only():
    """Fails if a sentence's label stops counting, or passes figures in the next sentence, the paragraph, the
    section or a table under its caption."""
    assert problems_of("It took 42 min (an earlier measurement, commit 7da47a9).\n") == []
    assert problems_of("| run | time | commit |\n|---|---|---|\n| a | 42 min | 7da47a9 |\n") == []
    assert problems_of("The paper (arXiv 2010.11929) reports 88.55% top-1.\n") == []
    assert problems_of("Dosovitskiy et al. (2021) report 88.55% top-1.\n") == []
    assert problems_of("It took 42 min (an earlier measurement).\n") != []  # no commit
    assert problems_of("## Earlier runs (commit 7da47a9)\n\nIt took 42 min.\n") != []
    assert problems_of("An earlier run (commit 7da47a9) was slower. It took 42 min.\n") != []
    assert problems_of("It took 42 min.\nAn earlier measurement at commit 7da47a9 gave more.\n") != []


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
    assert figures.main([]) == 1
    assert f"{PAGE}:1: the figure '42 min' has no source" in capsys.readouterr().err
    (tmp_path / PAGE).write_text("It took 42 min (an earlier measurement, commit 7da47a9).\n")
    assert figures.main([]) == 0


def test_the_label_words_are_the_ones_benchmarks_readme_documents():
    """Fails if a label word is added to or dropped from benchmarks/figures.py without the rule's text saying so."""
    text = (REPO / "benchmarks" / "README.md").read_text(encoding="utf-8")
    rule = text[text.index("**Figures in the pages.**") :].split("\n\n")[0]
    assert set(figures.EARLIER) <= set(re.findall(r"`([^`]+)`", rule)) and "a URL" in rule and "arXiv id" in rule


def test_the_figure_counts_table_is_generated_on_benchmarks_readme():
    text = (REPO / "benchmarks" / "README.md").read_text(encoding="utf-8")
    assert "<!-- table: figure_counts -->" in text


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
