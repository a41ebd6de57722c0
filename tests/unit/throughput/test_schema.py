"""Tests `throughput.schema`: reading a saved report, older schema versions upgraded."""

import json

import pytest

from hf_vit_scaling.throughput.schema import load_throughput_report
from hf_vit_scaling.throughput.summary import summarize
from tests.unit.throughput.figures import SETUP, rank_figures


def test_version_1_reports_load_as_version_2(tmp_path):
    report = summarize([rank_figures(10, 1.0, [0.1])], {**SETUP, "engine": "trainer", "zero_stage": None})
    old = json.loads(json.dumps(report))
    old["schema_version"] = 1
    for key in ("engine", "sequence_parallel_size", "tokens_per_rank"):
        del old["setup"][key]
    (tmp_path / "v1.json").write_text(json.dumps(old))
    loaded = load_throughput_report(str(tmp_path / "v1.json"))
    assert loaded["schema_version"] == 2 and loaded["setup"]["engine"] == "trainer"
    assert loaded["setup"]["sequence_parallel_size"] == 1 and loaded["setup"]["tokens_per_rank"] == 65
    (tmp_path / "v0.json").write_text(json.dumps({**old, "schema_version": 0}))
    with pytest.raises(ValueError, match="reads 1 and 2"):
        load_throughput_report(str(tmp_path / "v0.json"))
