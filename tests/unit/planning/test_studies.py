"""Scaling studies without running one: speedup and efficiency against published numbers, the columns paired with
their baseline, and the study grid (recipes/scaling_study.py). Studies that run are in
tests/launched/test_studies_launched.py."""

import re
import sys

import pytest

from hf_vit_scaling.planning.studies import add_scaling_columns, speedup, strong_efficiency, weak_efficiency
from tests.helpers.launchers import REPO


def test_speedup_and_efficiency_against_the_study_numbers():
    # arXiv 2602.21081, CIFAR-100 strong scaling on T4s: 1817.65 s on 1 GPU, 61.32 s on 32.
    assert speedup(1817.65, 61.32) == pytest.approx(29.64, abs=0.01)
    assert strong_efficiency(1817.65, 61.32, 32) == pytest.approx(0.926, abs=0.001)
    assert strong_efficiency(1817.65, 869.35, 2) == pytest.approx(1.045, abs=0.001)  # their superlinear 2-GPU point
    # Weak scaling, 1 -> 8 GPUs: 169.4 s -> 201.3 s, about 84%.
    assert weak_efficiency(169.4, 201.3) == pytest.approx(0.8415, abs=0.0005)


def test_scaling_columns_pair_rows_with_their_baseline():
    rows = [
        dict(
            status="ok",
            processes=1,
            global_batch=64,
            per_device_batch=64,
            ds_config="zero0",
            grad_accum=1,
            epoch_time_s=100.0,
        ),
        dict(
            status="ok",
            processes=2,
            global_batch=64,
            per_device_batch=32,
            ds_config="zero0",
            grad_accum=1,
            epoch_time_s=60.0,
        ),
        dict(
            status="failed",
            processes=4,
            global_batch=64,
            per_device_batch=16,
            ds_config="zero0",
            grad_accum=1,
            epoch_time_s=None,
        ),
        dict(
            status="ok",
            processes=2,
            global_batch=64,
            per_device_batch=32,
            ds_config="zero2",
            grad_accum=1,
            epoch_time_s=50.0,
        ),  # the only zero2 row: its own baseline
    ]
    strong = add_scaling_columns(rows, "strong")
    assert strong[1]["speedup"] == pytest.approx(100 / 60) and strong[1]["efficiency"] == pytest.approx(100 / 120)
    assert strong[2]["efficiency"] is None and strong[3]["efficiency"] == pytest.approx(1.0)
    weak = add_scaling_columns([dict(r, per_device_batch=32) for r in rows[:2]], "weak")
    assert weak[1]["efficiency"] == pytest.approx(100 / 60)
    batch = add_scaling_columns(
        [
            dict(rows[0], per_device_batch=32, epoch_time_s=10.0),
            dict(rows[1], per_device_batch=32, global_batch=128, epoch_time_s=8.0),
        ],
        "batch",
    )
    assert batch[1]["speedup"] == pytest.approx(1.25) and batch[1]["efficiency"] == pytest.approx(0.625)
    # No 1-process run (4 nodes x 1 and x 2 GPUs): the 4-process row is the baseline.
    multi = add_scaling_columns(
        [
            dict(rows[0], processes=1, world_size=4, epoch_time_s=40.0),
            dict(rows[1], processes=2, world_size=8, epoch_time_s=25.0),
        ],
        "strong",
    )
    assert multi[0]["efficiency"] == pytest.approx(1.0)
    assert multi[1]["speedup"] == pytest.approx(1.6) and multi[1]["efficiency"] == pytest.approx(4 * 40 / (8 * 25))


def test_study_grid_takes_heterogeneity_and_caps_the_per_device_batch():
    from hf_vit_scaling.planning.study_runner import StudyArguments, build_grid, cell_command

    args = StudyArguments(
        study="strong",
        output_dir="/tmp/unused",
        processes="1,2",
        global_batch_size=256,
        max_per_device_batch=64,
        simulate_slow_ranks="1:2.0;none",
    )
    grid = build_grid(args)
    assert [(c["processes"], c["per_device_batch"], c["grad_accum"], c["slow"]) for c in grid] == [
        (1, 64, 4, "1:2.0"),
        (1, 64, 4, ""),
        (2, 64, 2, "1:2.0"),
        (2, 64, 2, ""),
    ]
    assert all(c["global_batch"] == 256 for c in grid)
    cmd = [str(x) for x in cell_command(args, grid[2], 2, "/tmp/unused/run", ["--max_steps", "5"], 0)]
    assert cmd[cmd.index("--simulate_slow_ranks") + 1] == "1:2.0" and cmd[-2:] == ["--max_steps", "5"]
    assert "--nproc_per_node" in cmd and cmd[cmd.index("--nproc_per_node") + 1] == "2"
    assert grid[2]["name"] != grid[3]["name"]  # simulated and real cells never share a run folder


def test_zero_study_compares_every_zero_config_with_fsdp2_on_two_or_more_processes():
    from hf_vit_scaling.planning.study_runner import StudyArguments, build_grid, cell_command

    args = StudyArguments(study="zero", output_dir="/tmp/unused", processes="1,2")
    grid = build_grid(args)
    one = [c["ds_config"] for c in grid if c["processes"] == 1]
    two = [c["ds_config"] for c in grid if c["processes"] == 2]
    assert two == [*one, "fsdp2", "fsdp2_offload"] and not any(name.startswith("fsdp") for name in one)
    assert len({(c["per_device_batch"], c["grad_accum"]) for c in grid}) == 1  # same batch in every column
    commands = {c["ds_config"]: [str(x) for x in cell_command(args, c, i, "/tmp/run", [], 0)] for i, c in
                enumerate(grid) if c["processes"] == 2}  # fmt: skip
    fsdp = commands["fsdp2_offload"]
    assert "--fsdp" in fsdp and fsdp[fsdp.index("--fsdp_config") + 1] == str(REPO / "fsdp_configs/fsdp2_offload.json")
    assert "--ds_config" not in fsdp and "--fsdp" not in commands["zero3"]
    assert (REPO / "fsdp_configs/fsdp2_offload.json").is_file()


def test_every_node_keeps_its_own_launch_log_in_the_shared_run_folder(tmp_path, monkeypatch):
    # Two nodes run the same cell into one run folder (a shared file system). Each node's launcher output must
    # survive: node 1's error is exactly what node 0's log lacks when node 1 is the one that failed.
    from hf_vit_scaling.planning import study_runner as scaling_study

    def launch(a, cell, index, run_dir, extra, n_train):  # stands in for torchrun: prints, then fails on node 1
        code = f"import sys; print('node {a.node_rank} says hello'); sys.exit({a.node_rank})"
        return [sys.executable, "-c", code]

    monkeypatch.setattr(scaling_study, "cell_command", launch)
    for node in (1, 0):  # node 0 finishes last, as it would after waiting for the failed rendezvous
        args = scaling_study.StudyArguments(study="strong", output_dir=str(tmp_path), processes="1", nnodes=2,
                                            node_rank=node, global_batch_size=4)  # fmt: skip
        cell = scaling_study.build_grid(args)[0]
        row = scaling_study.run_cell(args, cell, 0, 1, [], 0)
    run_dir = tmp_path / "runs" / cell["name"]
    assert sorted(p.name for p in run_dir.iterdir()) == ["launch.node0.log", "launch.node1.log"]
    for node in (0, 1):
        assert f"node {node} says hello" in (run_dir / f"launch.node{node}.log").read_text()
    scaling_study.write_report(args, [row], [])  # node 0's report points at every node's log of a failed cell
    assert f"runs/{cell['name']}/launch.node{{0..1}}.log" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize(
    ("option", "value"),
    [("processes", "1,2,4,4"), ("batch_sizes", "16,32,16"), ("ds_configs", "zero0,none,zero0"),
     ("simulate_slow_ranks", "none;1:2.0;none")],
)  # fmt: skip
def test_a_value_listed_twice_is_refused_not_run_twice(option, value):
    # Two cells of one name share a run folder and a results row: the second would be "finished earlier" on node 0
    # and launched again on every other node, which then waits for a rendezvous that never comes.
    from hf_vit_scaling.planning.study_runner import StudyArguments, build_grid

    args = StudyArguments(study="batch", output_dir="/tmp/unused", **{option: value})
    message = rf"^error: --{option} {re.escape(value)} lists \S+ more than once\. Fix: list each value once\.$"
    with pytest.raises(SystemExit, match=message):
        build_grid(args)


@pytest.mark.parametrize(
    "option, value, words",
    [("processes", "1,x", "is not comma-separated whole numbers >= 1"),
     ("batch_sizes", "0,16", "is not comma-separated whole numbers >= 1"),
     ("accumulation_steps", "", "is not comma-separated whole numbers >= 1"),
     ("ds_configs", "zero2,zero9", "zero9 is not an engine"),
     ("simulate_slow_ranks", "none;1:x", "'1:x' is not RANK:FACTOR")],
)  # fmt: skip
def test_the_grid_flags_are_checked_before_any_cell_runs(tmp_path, option, value, words):
    """Fails if StudyArguments stops checking a grid flag's grammar (a bad cell would crash the grid with a
    traceback, or launch runs that fail one by one)."""
    from hf_vit_scaling.errors import UserInputError
    from hf_vit_scaling.planning.study_runner import StudyArguments

    with pytest.raises(UserInputError, match=re.escape(words)) as caught:
        StudyArguments(study="batch", output_dir=str(tmp_path), **{option: value})
    assert "Fix:" in str(caught.value)
