"""Throughput reports from real 2-process runs: images counted with gradient accumulation, a slow rank named."""

import re

import pytest

from tests.helpers.launchers import read_json, run_recipe


@pytest.mark.distributed
def test_images_counted_with_accumulation_and_two_processes(tmp_path):
    proc = run_recipe(
        tmp_path,
        "--ds_config",
        "ds_configs/zero2.json",
        "--max_steps",
        "8",
        "--eval_strategy",
        "no",
        "--gradient_accumulation_steps",
        "2",
        "--per_device_train_batch_size",
        "8",
        launcher="torchrun",
        nproc=2,
    )
    report = read_json(tmp_path / "throughput.json")
    t, s = report["throughput"], report["setup"]
    assert s["world_size"] == 2 and s["gradient_accumulation_steps"] == 2 and s["zero_stage"] == 2
    assert s["global_batch_size"] == 8 * 2 * 2 == t["nominal_images_per_step"]
    assert t["steps_measured"] == 8 - 2  # TINY_ARGS: --throughput_warmup_steps 2
    assert t["images_measured"] == t["steps_measured"] * 32
    assert [r["images"] for r in report["ranks"]["per_rank"]] == [6 * 16, 6 * 16]
    assert proc.stdout.count("Throughput report") == 1  # printed once, by the main process
    # A CPU has no streams to overlap a reduction with the backward: the recipe resolves ZeRO-2 as on one process
    # (no overlap, every gradient in one bucket), not as on GPUs (the run once resolved overlap_comm true here).
    resolved = s["deepspeed_resolved"]
    assert resolved["zero_optimization.overlap_comm"]["value"] is False
    assert resolved["zero_optimization.reduce_bucket_size"]["reason"].startswith("1 gradient flush a step")
    assert set(s["deepspeed_fast_paths"].values()) == {"on"}
    # Installed is not ran: what ran in the measured steps, once a step: on 2 processes no single-rank reduction, no
    # ZeRO-3 path; with 2 accumulation steps ZeRO-2 keeps its gradient hooks (zero2_no_gradient_hooks needs one).
    ran = s["deepspeed_fast_paths_ran"]
    assert ran["zero12_grouped_norm"] == ran["zero12_one_param_gather"] == t["steps_measured"], ran
    assert not {"zero12_single_rank_reduce", "zero2_no_gradient_hooks", "zero2_reduce_at_epilogue"} & ran.keys(), ran
    assert not [name for name in ran if name.startswith("zero3")], ran
    assert "installed, not run: " in proc.stdout + proc.stderr


@pytest.mark.distributed
def test_slow_rank_is_named_and_the_other_waits(tmp_path):
    proc = run_recipe(
        tmp_path,
        "--max_steps",
        "12",
        "--eval_strategy",
        "no",
        "--simulate_slow_ranks",
        "1:6.0",
        launcher="torchrun",
        nproc=2,
    )
    report = read_json(tmp_path / "throughput.json")
    ranks = report["ranks"]
    assert ranks["slowest_rank"] == 1 and ranks["fastest_rank"] == 0
    wait = {row["rank"]: row["est_sync_wait_s"] for row in ranks["per_rank"]}
    assert wait[0] > 0 and wait[0] > 5 * wait[1]
    # 6x slower compute, diluted by data wait and the optimizer: 1.62 was measured for 3x beside another test's runs
    # (make test's second worker), where 1.8 was asked; 6x leaves room for that load.
    assert ranks["spread"] > 1.8
    assert report["setup"]["simulated_slow_ranks"] == {"1": 6.0}
    assert re.search(r"SIMULATED slow ranks", proc.stdout)
