import csv
import os
import sys

import pytest
from helpers import REPO, run

from hf_vit_scaling import scaled_learning_rate
from hf_vit_scaling.scaling import add_scaling_columns, speedup, strong_efficiency, weak_efficiency

STUDY = REPO / "recipes" / "scaling_study.py"
TINY = ["--", "--model_preset", "vit-tiny-cpu", "--image_size", "16", "--max_steps", "12", "--eval_strategy", "no",
        "--max_eval_samples", "40", "--throughput_warmup_steps", "2", "--crop_scale_min", "0.5"]


def test_speedup_and_efficiency_against_the_study_numbers():
    # arXiv 2602.21081, CIFAR-100 strong scaling on T4s: 1817.65 s on 1 GPU, 61.32 s on 32.
    assert speedup(1817.65, 61.32) == pytest.approx(29.64, abs=0.01)
    assert strong_efficiency(1817.65, 61.32, 32) == pytest.approx(0.926, abs=0.001)
    assert strong_efficiency(1817.65, 869.35, 2) == pytest.approx(1.045, abs=0.001)  # their superlinear 2-GPU point
    # Weak scaling, 1 -> 8 GPUs: 169.4 s -> 201.3 s, about 84%.
    assert weak_efficiency(169.4, 201.3) == pytest.approx(0.8415, abs=0.0005)


def test_scaling_columns_pair_rows_with_their_baseline():
    rows = [
        dict(status="ok", processes=1, global_batch=64, per_device_batch=64, ds_config="zero0", grad_accum=1,
             epoch_time_s=100.0),
        dict(status="ok", processes=2, global_batch=64, per_device_batch=32, ds_config="zero0", grad_accum=1,
             epoch_time_s=60.0),
        dict(status="failed", processes=4, global_batch=64, per_device_batch=16, ds_config="zero0", grad_accum=1,
             epoch_time_s=None),
        dict(status="ok", processes=2, global_batch=64, per_device_batch=32, ds_config="zero2", grad_accum=1,
             epoch_time_s=50.0),  # the only zero2 row: its own baseline
    ]
    strong = add_scaling_columns(rows, "strong")
    assert strong[1]["speedup"] == pytest.approx(100 / 60) and strong[1]["efficiency"] == pytest.approx(100 / 120)
    assert strong[2]["efficiency"] is None and strong[3]["efficiency"] == pytest.approx(1.0)
    weak = add_scaling_columns([dict(r, per_device_batch=32) for r in rows[:2]], "weak")
    assert weak[1]["efficiency"] == pytest.approx(100 / 60)
    batch = add_scaling_columns([dict(rows[0], per_device_batch=32, epoch_time_s=10.0),
                                 dict(rows[1], per_device_batch=32, global_batch=128, epoch_time_s=8.0)], "batch")
    assert batch[1]["speedup"] == pytest.approx(1.25) and batch[1]["efficiency"] == pytest.approx(0.625)
    # No 1-process run (4 nodes x 1 and x 2 GPUs): the 4-process row is the baseline.
    multi = add_scaling_columns([dict(rows[0], processes=1, world_size=4, epoch_time_s=40.0),
                                 dict(rows[1], processes=2, world_size=8, epoch_time_s=25.0)], "strong")
    assert multi[0]["efficiency"] == pytest.approx(1.0)
    assert multi[1]["speedup"] == pytest.approx(1.6) and multi[1]["efficiency"] == pytest.approx(4 * 40 / (8 * 25))


def test_lr_scaling_rules():
    assert scaled_learning_rate(1e-4, 512, 64, "linear") == pytest.approx(8e-4)
    assert scaled_learning_rate(1e-4, 512, 64, "sqrt") == pytest.approx(1e-4 * 8**0.5)
    assert scaled_learning_rate(1e-4, 512, 64, "none") == 1e-4


def _rows(folder):
    with open(folder / "results.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.distributed
def test_two_cell_strong_study_end_to_end_and_resume(tmp_path):
    cmd = [sys.executable, STUDY, "--study", "strong", "--processes", "1,2", "--global_batch_size", "16",
           "--ds_configs", "none", "--output_dir", tmp_path, *TINY]
    proc = run(cmd, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[1/2]" in proc.stdout and "[2/2]" in proc.stdout
    rows = _rows(tmp_path)
    assert [(r["processes"], r["per_device_batch"], r["status"]) for r in rows] == [("1", "16", "ok"), ("2", "8", "ok")]
    assert float(rows[0]["efficiency"]) == pytest.approx(1.0)
    assert float(rows[1]["efficiency"]) == pytest.approx(
        float(rows[0]["epoch_time_s"]) / (2 * float(rows[1]["epoch_time_s"])))
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


@pytest.mark.distributed
def test_a_failing_cell_is_recorded_and_the_study_goes_on(tmp_path):
    cmd = [sys.executable, STUDY, "--study", "zero", "--processes", "1", "--ds_configs", "no_such_config,none",
           "--output_dir", tmp_path, *TINY]
    proc = run(cmd, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["ds_config"]: r for r in _rows(tmp_path)}
    assert rows["no_such_config"]["status"] == "failed"
    assert "--ds_config" in rows["no_such_config"]["reason"] and "no such file" in rows["no_such_config"]["reason"]
    assert rows["none"]["status"] == "ok" and float(rows["none"]["images_per_s"]) > 0
    assert "Failed runs" in (tmp_path / "report.md").read_text()


@pytest.mark.distributed
def test_two_nodes_on_one_machine(tmp_path):
    """Two torchrun invocations, --nnodes 2 with node ranks 0 and 1 over loopback, one process each."""
    import subprocess

    from helpers import RECIPE, TINY_ARGS, free_port, launcher_cmd, read_json, test_env

    port = str(free_port())
    procs = []
    for node_rank in (0, 1):
        cmd = [launcher_cmd("torchrun", 1)[0], "--nnodes", "2", "--node_rank", str(node_rank), "--nproc_per_node",
               "1", "--master_addr", "127.0.0.1", "--master_port", port, str(RECIPE),
               "--output_dir", str(tmp_path / f"node{node_rank}"), *TINY_ARGS, "--ds_config",
               str(REPO / "ds_configs" / "zero2.json"), "--max_steps", "10", "--eval_strategy", "no",
               "--max_eval_samples", "40"]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env=test_env(), cwd=REPO))
    outputs = [p.communicate(timeout=600) for p in procs]
    for p, (_out, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-3000:]
    report = read_json(tmp_path / "node0" / "throughput.json")
    assert report["setup"]["num_nodes"] == 2 and report["setup"]["world_size"] == 2
    assert not (tmp_path / "node1" / "throughput.json").exists()  # only the main process writes


def test_study_grid_takes_heterogeneity_and_caps_the_per_device_batch():
    sys.path.insert(0, str(REPO / "recipes"))
    from scaling_study import StudyArguments, build_grid, cell_command

    args = StudyArguments(study="strong", output_dir="/tmp/unused", processes="1,2", global_batch_size=256,
                          max_per_device_batch=64, simulate_slow_ranks="1:2.0;none")
    grid = build_grid(args)
    assert [(c["processes"], c["per_device_batch"], c["grad_accum"], c["slow"]) for c in grid] == [
        (1, 64, 4, "1:2.0"), (1, 64, 4, ""), (2, 64, 2, "1:2.0"), (2, 64, 2, "")]
    assert all(c["global_batch"] == 256 for c in grid)
    cmd = [str(x) for x in cell_command(args, grid[2], 2, "/tmp/unused/run", ["--max_steps", "5"], 0)]
    assert cmd[cmd.index("--simulate_slow_ranks") + 1] == "1:2.0" and cmd[-2:] == ["--max_steps", "5"]
    assert "--nproc_per_node" in cmd and cmd[cmd.index("--nproc_per_node") + 1] == "2"
    assert grid[2]["name"] != grid[3]["name"]  # simulated and real cells never share a run folder
