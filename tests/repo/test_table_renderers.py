"""Generated tables from results files that a run on another machine may write with less in them."""

import json
import sys

from tests.helpers.launchers import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import table_renderers  # noqa: E402

COST = REPO / "benchmarks" / "results" / "regularization_cost.json"


def test_regularization_cost_without_kornia_leaves_its_columns_out():
    """A run without kornia installed writes no kornia rows (benchmarks/regularization_cost.py); the table must still
    render (it raised KeyError on the first kornia cell) and say why the columns are missing."""
    result = json.loads(COST.read_text(encoding="utf-8"))
    with_kornia = table_renderers.regularization_cost(result)
    assert "kornia, 32 px" in with_kornia
    result["setup"]["kornia"] = None
    result["rows"] = [row for row in result["rows"] if not row["augmentation"].startswith("kornia")]
    without = table_renderers.regularization_cost(result)
    assert "kornia, 32 px" not in without and "kornia was not installed" in without
    assert without.splitlines()[2].startswith("| RandAugment") and without.splitlines()[2].count("|") == 4
