"""The throughput callback driven through Trainer events in one process: warm-up excluded, evaluation not counted as
data wait, the report's schema (and the README explaining every key), the sync-wait estimate. Runs over 2 processes
are in tests/launched/test_throughput_launched.py."""

import time

import pytest
import torch
from transformers import TrainerControl, TrainerState, TrainingArguments, ViTConfig, ViTForImageClassification

from hf_vit_scaling import ThroughputCallback, format_report, load_throughput_report
from hf_vit_scaling.throughput import REPORT_SCHEMA, estimate_sync_wait
from tests.helpers import REPO

README = REPO / "README.md"


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
