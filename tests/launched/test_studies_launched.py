"""Scaling studies run for real: recipes/scaling_study.py launching the recipe cell by cell (1 and 2 processes),
resuming a finished study, and recording a failing cell without stopping."""

import csv
import os
import sys

import pytest

from tests.helpers.launchers import STUDY, run

TINY = [
    "--",
    "--model_preset",
    "vit-tiny-cpu",
    "--image_size",
    "16",
    "--max_steps",
    "12",
    "--eval_strategy",
    "no",
    "--max_eval_samples",
    "40",
    "--throughput_warmup_steps",
    "2",
    "--crop_scale_min",
    "0.5",
]


def _rows(folder):
    with open(folder / "results.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.distributed
def test_two_cell_strong_study_end_to_end_and_resume(tmp_path):
    cmd = [
        sys.executable,
        STUDY,
        "--study",
        "strong",
        "--processes",
        "1,2",
        "--global_batch_size",
        "16",
        "--ds_configs",
        "none",
        "--output_dir",
        tmp_path,
        *TINY,
    ]
    proc = run(cmd, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[1/2]" in proc.stdout and "[2/2]" in proc.stdout
    rows = _rows(tmp_path)
    assert [(r["processes"], r["per_device_batch"], r["status"]) for r in rows] == [
        ("1", "16", "ok"),
        ("2", "8", "ok"),
    ]
    assert float(rows[0]["efficiency"]) == pytest.approx(1.0)
    assert float(rows[1]["efficiency"]) == pytest.approx(
        float(rows[0]["epoch_time_s"]) / (2 * float(rows[1]["epoch_time_s"]))
    )
    report = (tmp_path / "report.md").read_text()
    assert "| 2 | 1 | 8 |" in report and "efficiency" in report and "Hardware:" in report
    assert (tmp_path / "strong.png").stat().st_size > 10_000
    stamp = os.path.getmtime(tmp_path / "runs" / "strong-n2x1-b8-a1-none" / "throughput.json")
    again = run(cmd, timeout=600)
    assert again.returncode == 0 and again.stdout.count("finished earlier, skipped") == 2
    assert os.path.getmtime(tmp_path / "runs" / "strong-n2x1-b8-a1-none" / "throughput.json") == stamp

    def without_wall(table):
        return [{k: v for k, v in r.items() if k != "wall_s"} for r in table]

    assert without_wall(_rows(tmp_path)) == without_wall(rows)


def test_an_unknown_engine_is_refused_before_any_cell_runs(tmp_path):
    """An engine name with no config in ds_configs/ or fsdp_configs/ would fail every cell it is part of, after the
    cells before it ran: it stops the study at once, one error line, nothing run. (A cell that fails while it runs is
    recorded and the study goes on: tests/unit/planning/test_studies.py.) Fails if the study's grid flags are not
    checked before the cells (planning/study_runner.check_engine_names)."""
    cmd = [sys.executable, STUDY, "--study", "zero", "--processes", "1", "--ds_configs", "no_such_config,none",
           "--output_dir", tmp_path / "study", *TINY]  # fmt: skip
    proc = run(cmd, timeout=600)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "no_such_config is not an engine" in errors[0] and "zero2" in errors[0]
    assert not (tmp_path / "study" / "runs").exists()
