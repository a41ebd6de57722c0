"""Every results file says where it comes from: a `provenance` block written by the run (command, commit, CPU,
versions, date: benchmarks/_common.provenance), or, for the files older than that rule, one reconstructed from git
history that says so. No new file may be reconstructed."""

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
# ... and the recipe folders' own (benchmarks/recipe_results.py, RESULTS=<file> on a recipe script).
RECIPE_RESULTS = sorted((REPO / "recipes").glob("*/results*.json"))
# The files written before runs recorded their provenance (issue 44); reconstructed on 2026-12-04.
RECONSTRUCTED = {
    "callback_overhead", "hetero_balance", "host_path_regularization", "input_path", "planner_memory",
    "planner_study", "regularization_cost", "sequence_parallel_cpu", "sequence_parallel_cpu_run2",
    "synthetic_floor", "trainer_overhead", "trainer_overhead_b128", "variable_size_accuracy",
}  # fmt: skip


@pytest.mark.parametrize(
    "path", sorted(RESULTS.glob("*.json")) + RECIPE_RESULTS, ids=lambda p: p.parent.name + "/" + p.stem
)
def test_every_results_file_carries_its_provenance(path):
    where = json.loads(path.read_text(encoding="utf-8")).get("provenance")
    assert isinstance(where, dict), (
        f"{path.name} has no provenance block: write it with benchmarks/_common.report_result"
    )
    assert where.get("command"), path.name
    if where.get("reconstructed"):
        assert path.stem in RECONSTRUCTED, f"{path.name}: only the older files may carry a reconstructed provenance"
        assert where.get("committed_in") and where.get("committed_on") and where.get("note"), path.name
    else:
        for key in ("commit", "date", "versions", "cpu"):
            assert where.get(key), f"{path.name}: provenance without {key}"
