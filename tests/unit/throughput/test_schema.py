"""Tests `throughput.schema`: reading a saved report, older schema versions upgraded."""

import json

import pytest

from hf_vit_scaling.throughput.schema import load_throughput_report
from hf_vit_scaling.throughput.summary import summarize
from tests.unit.throughput.figures import SETUP, rank_figures


def _older(version: int) -> dict:
    """A report as that schema version wrote it: version 6 had no record of the engine's route, version 5 none of
    DeepSpeed's fast paths either, version 4 none
    of the DeepSpeed values set either, version 3 no compile section either, version 2 no teacher figures either,
    version 1 neither the engine nor sequence parallelism."""
    report = summarize([rank_figures(10, 1.0, [0.1])], {**SETUP, "engine": "trainer", "zero_stage": None})
    old = json.loads(json.dumps(report))
    old["schema_version"] = version
    del old["setup"]["engine_route"]
    del old["setup"]["deepspeed_fast_paths_ran"]
    if version == 6:
        return old
    del old["setup"]["deepspeed_fast_paths"]
    if version == 5:
        return old
    del old["setup"]["deepspeed_resolved"]
    if version == 4:
        return old
    del old["compile"]
    if version == 3:
        return old
    for key in ("teacher_forward_flops_per_image", "teacher_flops_fraction"):
        del old["flops"][key]
    if version == 1:
        for key in ("engine", "sequence_parallel_size", "tokens_per_rank"):
            del old["setup"][key]
    return old


def test_version_1_to_6_reports_load_as_version_7(tmp_path):
    """Fails if an older report no longer loads, or loads with a compile section that claims anything (an old file
    never recorded what compile did)."""
    (tmp_path / "v1.json").write_text(json.dumps(_older(1)))
    loaded = load_throughput_report(str(tmp_path / "v1.json"))
    assert loaded["schema_version"] == 7 and loaded["setup"]["engine"] == "trainer"
    assert loaded["setup"]["sequence_parallel_size"] == 1 and loaded["setup"]["tokens_per_rank"] == 65
    assert loaded["flops"]["teacher_forward_flops_per_image"] is None
    (tmp_path / "v2.json").write_text(json.dumps(_older(2)))
    loaded = load_throughput_report(str(tmp_path / "v2.json"))
    assert loaded["schema_version"] == 7 and loaded["flops"]["teacher_flops_fraction"] is None
    assert loaded["flops"]["mfu"] == _older(2)["flops"]["mfu"]  # the student's alone, as it was
    (tmp_path / "v3.json").write_text(json.dumps(_older(3)))
    loaded = load_throughput_report(str(tmp_path / "v3.json"))
    assert loaded["schema_version"] == 7 and set(loaded["compile"].values()) == {None}
    (tmp_path / "v4.json").write_text(json.dumps(_older(4)))
    loaded = load_throughput_report(str(tmp_path / "v4.json"))
    assert loaded["schema_version"] == 7 and loaded["setup"]["deepspeed_resolved"] == {}
    (tmp_path / "v5.json").write_text(json.dumps(_older(5)))
    loaded = load_throughput_report(str(tmp_path / "v5.json"))
    assert loaded["schema_version"] == 7 and loaded["setup"]["deepspeed_fast_paths"] == {}
    (tmp_path / "v6.json").write_text(json.dumps(_older(6)))
    loaded = load_throughput_report(str(tmp_path / "v6.json"))
    assert loaded["schema_version"] == 7 and loaded["setup"]["engine_route"] is None
    assert loaded["setup"]["deepspeed_fast_paths_ran"] == {}
    (tmp_path / "v0.json").write_text(json.dumps({**_older(2), "schema_version": 0}))
    with pytest.raises(ValueError, match="reads 1 to 7"):
        load_throughput_report(str(tmp_path / "v0.json"))
