"""The throughput callback driven through Trainer events in one process: warm-up excluded, evaluation not counted as
data wait, the report's schema (docs/throughput.md shows every key), the sync-wait estimate. Runs over 2 processes
are in tests/launched/test_throughput_launched.py."""

import json

import pytest
import torch
from transformers import TrainerControl, TrainerState, TrainingArguments, ViTForImageClassification

from hf_vit_scaling.throughput import timing
from hf_vit_scaling.throughput.report import format_report
from hf_vit_scaling.throughput.schema import REPORT_SCHEMA, load_throughput_report, schema_markdown
from hf_vit_scaling.throughput.summary import estimate_sync_wait, summarize
from hf_vit_scaling.throughput.timing import ThroughputCallback
from tests.helpers.builders import tiny_vit_config
from tests.helpers.launchers import REPO

THROUGHPUT_DOC = REPO / "docs" / "throughput.md"


def test_sync_wait_against_hand_computed_values():
    # Step 1: rank work 1.0 / 3.0 -> rank 0 waits 2.0; step 2: 2.0 / 2.5 -> 0.5. Rank 1 never waits.
    assert estimate_sync_wait([[1.0, 2.0], [3.0, 2.5]]) == pytest.approx([2.5, 0.0])
    assert estimate_sync_wait([[1.0], [1.0], [1.0]]) == [0.0, 0.0, 0.0]


class _Clock:
    """Stands in for time.perf_counter in the timing module: time passes only when the test says so, so the
    figures are exact whatever the machine's load."""

    def __init__(self):
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


STEP_COMPUTE_S = 0.01  # what every step's forward, backward and optimizer "take" on the fake clock


class _Driver:
    """Drives the callback through Trainer events in one process, with a real tiny model and a fake clock."""

    def __init__(self, tmp_path, warmup_steps, clock):
        self.clock = clock
        self.args = TrainingArguments(
            output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=4, report_to="none"
        )
        self.state, self.control = TrainerState(), TrainerControl()
        config = tiny_vit_config()
        self.model = ViTForImageClassification(config).train()
        self.cb = ThroughputCallback(warmup_steps=warmup_steps, peak_tflops=1.0, print_table=False)
        self.cb.on_train_begin(self.args, self.state, self.control, model=self.model)

    def step(self, batch=4, extra_seconds=0.0, wait_before=0.0, evaluate_before=False):
        if evaluate_before:
            self.cb.on_evaluate(self.args, self.state, self.control)
        self.clock.sleep(wait_before)
        self.cb.on_step_begin(self.args, self.state, self.control)
        loss = self.model(pixel_values=torch.randn(batch, 3, 8, 8), labels=torch.zeros(batch, dtype=torch.long)).loss
        loss.backward()
        self.clock.sleep(STEP_COMPUTE_S + extra_seconds)
        self.cb.on_step_end(self.args, self.state, self.control)

    def report(self):
        self.state.is_world_process_zero = True
        self.cb.on_train_end(self.args, self.state, self.control)
        return self.cb.report


@pytest.fixture
def clock(monkeypatch):
    fake = _Clock()
    monkeypatch.setattr(timing, "time", fake)
    return fake


def test_warmup_steps_are_excluded(tmp_path, clock):
    driver = _Driver(tmp_path, warmup_steps=3, clock=clock)
    for _ in range(3):
        driver.step(extra_seconds=0.3)  # slow warm-up (compilation, caches)
    for _ in range(6):
        driver.step(batch=5)
    report = driver.report()
    assert report["throughput"]["steps_measured"] == 6
    assert report["throughput"]["images_measured"] == 30  # 6 steps x 5 images; warm-up's 4-image batches excluded
    assert report["step_time_s"]["p90"] == pytest.approx(STEP_COMPUTE_S)  # none of the slow warm-up steps
    with_warmup = _Driver(tmp_path, warmup_steps=0, clock=clock)
    for _ in range(3):
        with_warmup.step(extra_seconds=0.3)
    assert with_warmup.report()["step_time_s"]["mean"] == pytest.approx(0.3 + STEP_COMPUTE_S)


def test_eval_time_is_not_data_wait(tmp_path, clock):
    driver = _Driver(tmp_path, warmup_steps=0, clock=clock)
    driver.step()
    driver.step(wait_before=0.05)
    driver.step(wait_before=0.5, evaluate_before=True)
    report = driver.report()
    assert report["step_time_s"]["data_wait_mean"] == pytest.approx(0.05)  # the 0.5 s evaluation pause is not counted
    assert report["throughput"]["measured_time_s"] == pytest.approx(3 * STEP_COMPUTE_S + 0.05)


def test_report_has_the_documented_schema_and_the_docs_page_shows_it(tmp_path, clock):
    driver = _Driver(tmp_path, warmup_steps=1, clock=clock)
    for _ in range(4):
        driver.step()
    report = driver.report()
    assert load_throughput_report(str(tmp_path / "throughput.json")) == report
    for section, keys in REPORT_SCHEMA.items():
        assert sorted(report[section]) == sorted(keys), section
    assert schema_markdown() in THROUGHPUT_DOC.read_text(encoding="utf-8"), "regenerate the table in the page"
    assert "Throughput report" in format_report(report)
    assert report["flops"]["mfu"] == pytest.approx(report["flops"]["achieved_tflops_per_device"] / 1.0)


def _rank_figures(images, measured_time, own_work, node="host#0"):
    return {
        "steps": len(own_work), "images": images, "measured_time": measured_time, "compute_mean": 0.5,
        "data_wait_mean": 0.1, "forward_mean": 0.1, "step_time_mean": 0.6, "step_time_median": 0.6,
        "step_time_p90": 0.7, "own_work": own_work, "device": "cpu", "hostname": node.split("#")[0], "node": node,
        "memory": {"allocated_peak_bytes": None, "reserved_peak_bytes": None, "rss_peak_bytes": 100 * 2**20},
    }  # fmt: skip


SETUP = {
    "engine": "deepspeed", "per_device_train_batch_size": 8, "gradient_accumulation_steps": 2, "zero_stage": 2,
    "offload": {}, "precision": "fp32", "image_size": 32, "patch_size": 4, "num_parameters": 1000,
    "forward_macs_per_image": 10**9, "train_flops_per_image": 6 * 10**9, "versions": {}, "simulated_slow_ranks": {},
    "rank_batches": None, "sequence_parallel_size": 1, "warmup_steps": 2, "peak_tflops": 1.0,
    "peak_source": "user", "memory_kind": "rss_peak_bytes",
}  # fmt: skip


def test_summarize_is_pure_arithmetic_over_the_ranks():
    # Rank 1 is slower: its 4 s is the measured time; 2 x 64 images / 4 s = 32 images/s.
    per_rank = [_rank_figures(64, 3.0, [1.0, 1.0]), _rank_figures(64, 4.0, [1.5, 2.0], node="other#1")]
    report = summarize(per_rank, SETUP)
    assert report["throughput"]["images_per_s"] == pytest.approx(32.0)
    assert report["setup"]["global_batch_size"] == 8 * 2 * 2 == report["throughput"]["nominal_images_per_step"]
    assert report["setup"]["num_nodes"] == 2 and report["setup"]["tokens_per_image"] == 65
    assert report["ranks"]["slowest_rank"] == 1 and report["ranks"]["spread"] == pytest.approx(1.75)
    assert report["ranks"]["est_sync_wait_s_total"] == pytest.approx(0.5 + 1.0)
    assert report["flops"]["mfu"] == pytest.approx(32.0 * 6e9 / 1e12 / 2)  # per device, peak 1 TFLOP/s
    sp = summarize(per_rank, {**SETUP, "sequence_parallel_size": 2})  # 2 ranks share each image
    assert sp["throughput"]["images_measured"] == 64 and sp["setup"]["global_batch_size"] == 16
    assert sp["setup"]["tokens_per_rank"] == 33
    for section, keys in REPORT_SCHEMA.items():
        assert sorted(report[section]) == sorted(keys), section


def test_version_1_reports_load_as_version_2(tmp_path):
    report = summarize([_rank_figures(10, 1.0, [0.1])], {**SETUP, "engine": "trainer", "zero_stage": None})
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
