import re
import time
from pathlib import Path

import pytest
import torch
from helpers import read_json, run_recipe
from transformers import TrainerControl, TrainerState, TrainingArguments, ViTConfig, ViTForImageClassification

from hf_vit_scaling import ThroughputCallback, format_report, load_throughput_report
from hf_vit_scaling.throughput import REPORT_SCHEMA, estimate_sync_wait

README = Path(__file__).resolve().parents[1] / "README.md"


def test_sync_wait_against_hand_computed_values():
    # Step 1: rank work 1.0 / 3.0 -> rank 0 waits 2.0; step 2: 2.0 / 2.5 -> 0.5. Rank 1 never waits.
    assert estimate_sync_wait([[1.0, 2.0], [3.0, 2.5]]) == pytest.approx([2.5, 0.0])
    assert estimate_sync_wait([[1.0], [1.0], [1.0]]) == [0.0, 0.0, 0.0]


class _Driver:
    """Drives the callback through Trainer events in one process, with a real tiny model."""

    def __init__(self, tmp_path, warmup_steps):
        self.args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=4,
                                      report_to="none")
        self.state, self.control = TrainerState(), TrainerControl()
        config = ViTConfig(image_size=8, patch_size=4, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=32, num_labels=3)
        self.model = ViTForImageClassification(config).train()
        self.cb = ThroughputCallback(warmup_steps=warmup_steps, peak_tflops=1.0, print_table=False)
        self.cb.on_train_begin(self.args, self.state, self.control, model=self.model)

    def step(self, batch=4, extra_seconds=0.0, wait_before=0.0, evaluate_before=False):
        if evaluate_before:
            self.cb.on_evaluate(self.args, self.state, self.control)
        time.sleep(wait_before)
        self.cb.on_step_begin(self.args, self.state, self.control)
        loss = self.model(pixel_values=torch.randn(batch, 3, 8, 8), labels=torch.zeros(batch, dtype=torch.long)).loss
        loss.backward()
        time.sleep(extra_seconds)
        self.cb.on_step_end(self.args, self.state, self.control)

    def report(self):
        self.state.is_world_process_zero = True
        self.cb.on_train_end(self.args, self.state, self.control)
        return self.cb.report


def test_warmup_steps_are_excluded(tmp_path):
    driver = _Driver(tmp_path, warmup_steps=3)
    for _ in range(3):
        driver.step(extra_seconds=0.3)  # slow warm-up (compilation, caches)
    for _ in range(6):
        driver.step(batch=5)
    report = driver.report()
    assert report["throughput"]["steps_measured"] == 6
    assert report["throughput"]["images_measured"] == 30  # 6 steps x 5 images; warm-up's 4-image batches excluded
    assert report["step_time_s"]["p90"] < 0.3  # none of the slow warm-up steps
    with_warmup = _Driver(tmp_path, warmup_steps=0)
    for _ in range(3):
        with_warmup.step(extra_seconds=0.3)
    assert with_warmup.report()["step_time_s"]["mean"] >= 0.3


def test_eval_time_is_not_data_wait(tmp_path):
    driver = _Driver(tmp_path, warmup_steps=0)
    driver.step()
    driver.step(wait_before=0.05)
    driver.step(wait_before=0.5, evaluate_before=True)
    report = driver.report()
    assert 0.04 < report["step_time_s"]["data_wait_mean"] < 0.2  # the 0.5 s evaluation pause is not counted
    assert report["throughput"]["measured_time_s"] < 0.5 + 0.3


def test_report_has_the_documented_schema_and_readme_explains_it(tmp_path):
    driver = _Driver(tmp_path, warmup_steps=1)
    for _ in range(4):
        driver.step()
    report = driver.report()
    assert load_throughput_report(str(tmp_path / "throughput.json")) == report
    for section, keys in REPORT_SCHEMA.items():
        assert sorted(report[section]) == sorted(keys), section
    readme = README.read_text()
    for section, keys in REPORT_SCHEMA.items():
        for key in keys:
            assert f"`{key}`" in readme, f"README does not explain {section}.{key}"
    assert "Throughput report" in format_report(report)
    assert report["flops"]["mfu"] == pytest.approx(report["flops"]["achieved_tflops_per_device"] / 1.0)


@pytest.mark.distributed
def test_images_counted_with_accumulation_and_two_processes(tmp_path):
    proc = run_recipe(tmp_path, "--ds_config", "ds_configs/zero2.json", "--max_steps", "8", "--eval_strategy", "no",
                      "--gradient_accumulation_steps", "2", "--per_device_train_batch_size", "8",
                      launcher="torchrun", nproc=2)
    report = read_json(tmp_path / "throughput.json")
    t, s = report["throughput"], report["setup"]
    assert s["world_size"] == 2 and s["gradient_accumulation_steps"] == 2 and s["zero_stage"] == 2
    assert s["global_batch_size"] == 8 * 2 * 2 == t["nominal_images_per_step"]
    assert t["steps_measured"] == 8 - 2  # TINY_ARGS: --throughput_warmup_steps 2
    assert t["images_measured"] == t["steps_measured"] * 32
    assert [r["images"] for r in report["ranks"]["per_rank"]] == [6 * 16, 6 * 16]
    assert proc.stdout.count("Throughput report") == 1  # printed once, by the main process


@pytest.mark.distributed
def test_slow_rank_is_named_and_the_other_waits(tmp_path):
    proc = run_recipe(tmp_path, "--max_steps", "12", "--eval_strategy", "no", "--simulate_slow_ranks", "1:3.0",
                      launcher="torchrun", nproc=2)
    report = read_json(tmp_path / "throughput.json")
    ranks = report["ranks"]
    assert ranks["slowest_rank"] == 1 and ranks["fastest_rank"] == 0
    wait = {row["rank"]: row["est_sync_wait_s"] for row in ranks["per_rank"]}
    assert wait[0] > 0 and wait[0] > 5 * wait[1]
    assert ranks["spread"] > 1.8  # 3x slower compute, diluted by data wait
    assert report["setup"]["simulated_slow_ranks"] == {"1": 3.0}
    assert re.search(r"SIMULATED slow ranks", proc.stdout)
