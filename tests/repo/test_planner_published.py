"""The planner against published runs (benchmarks/planner_published.py -> benchmarks/results/planner_published.json
-> docs/planner.md): the page's tables regenerate from the results file, and the recorded recipes/plan.py commands
reproduce the planner's numbers in it."""

import importlib.util
import json
import shlex
import sys

import pytest

from tests.helpers.launchers import REPO

sys.path.insert(0, str(REPO / "benchmarks"))  # as when run as a script: its modules import their neighbours


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tables, published = load("tables"), load("planner_published")
RESULT = json.loads((REPO / "benchmarks/results/planner_published.json").read_text(encoding="utf-8"))
PAGE = REPO / "docs/planner.md"
NAMES = ["planner_published", "planner_published_scaling", "planner_published_inputs", "planner_published_commands",
         "planner_projection"]  # fmt: skip


@pytest.mark.parametrize("name", NAMES)
def test_the_page_table_regenerates_from_the_results_file(name):
    """Fails if a table on docs/planner.md is missing or differs from what its renderer makes of the results file."""
    blocks = {m.group("name"): m.group("body") for m in tables.BLOCK.finditer(PAGE.read_text(encoding="utf-8"))}
    assert tables.TABLES[name][0] == "benchmarks/results/planner_published.json"
    assert blocks[name] == tables.render(name, PAGE)


def plan_flags(command: str) -> list[str]:
    words = shlex.split(command)
    assert words[:2] == ["python", "recipes/plan.py"]
    return words[2:]


@pytest.mark.parametrize("row", RESULT["runs"], ids=[r["run"] for r in RESULT["runs"]])
def test_each_recorded_command_reproduces_the_planner_numbers(row):
    """Fails if the planner no longer gives the figures recorded beside a published run (memory, fit, largest
    batch, speed, communication terms) for the recorded recipes/plan.py command."""
    engine = None if row["group"].startswith("nemo") else row["planner"]["engine"]
    again = published.planned(plan_flags(row["command"]), engine)
    recorded = {key: value for key, value in row["planner"].items() if key != "images_per_s_per_node"}
    assert again == recorded
    if "ratio" in row:  # images/s per node over the reported figure per node
        ratio = again["images_per_s"] / row["reported"]["images_per_s"]
        assert ratio == pytest.approx(row["ratio"], abs=1e-4)


def test_projection_commands_reproduce_their_rows():
    """Fails if a projection row's recorded command gives another recommended engine, step or throughput."""
    for row in RESULT["projection"][::5]:  # a spread of rows: every model, scaling, size and network appears
        again = published.planned(plan_flags(row["command"]), None)
        assert (again["engine"], again["step_s"], again["images_per_s"]) == (
            row["recommended"],
            row["step_s"],
            row["images_per_s"],
        )


def test_the_published_setups_fit_and_nemo_scaling_is_within_ten_points():
    """Fails if the planner says a published setup does not fit on its GPUs, or if its 16-node scaling efficiency
    for NeMo's ViT g/14 is more than 10 points from the published one."""
    assert all(row["planner"]["fits"] for row in RESULT["runs"])
    for efficiency in RESULT["scaling_efficiency"].values():
        assert abs(efficiency["difference_points"]) <= 10
