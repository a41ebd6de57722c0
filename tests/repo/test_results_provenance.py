"""Every results file says where it comes from: a `provenance` block written by the run (command, commit, CPU,
versions, date: benchmarks/_common.provenance). The files older than that rule carried one reconstructed from git
history until they were rerun (issue 44, 2026-12-05); none may carry one now."""

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
# ... and the recipe folders' own (benchmarks/recipe_results.py, RESULTS=<file> on a recipe script).
RECIPE_RESULTS = sorted((REPO / "recipes").glob("*/results*.json"))


@pytest.mark.parametrize(
    "path", sorted(RESULTS.glob("*.json")) + RECIPE_RESULTS, ids=lambda p: p.parent.name + "/" + p.stem
)
def test_every_results_file_carries_its_provenance(path):
    where = json.loads(path.read_text(encoding="utf-8")).get("provenance")
    assert isinstance(where, dict), (
        f"{path.name} has no provenance block: write it with benchmarks/_common.report_result"
    )
    assert where.get("command"), path.name
    assert not where.get("reconstructed"), f"{path.name}: a reconstructed provenance; rerun its command"
    for key in ("commit", "date", "versions", "cpu"):
        assert where.get(key), f"{path.name}: provenance without {key}"
