"""Tests `throughput.timing`: the callback through Trainer events, in one process (2 processes: tests/launched/)."""

import pytest
import torch
from transformers import TrainerControl, TrainerState, TrainingArguments, ViTForImageClassification

from hf_vit_scaling.data.device_transforms import DevicePreprocessor
from hf_vit_scaling.throughput import timing
from hf_vit_scaling.throughput.report import format_report
from hf_vit_scaling.throughput.schema import REPORT_SCHEMA, load_throughput_report, schema_markdown
from hf_vit_scaling.throughput.timing import ThroughputCallback
from tests.helpers.builders import tiny_vit_config
from tests.helpers.launchers import REPO

THROUGHPUT_DOC = REPO / "docs" / "throughput.md"


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

    def __init__(self, tmp_path, warmup_steps, clock, input_s=None, model_forward_s=0.0, teacher_config=None):
        self.clock = clock
        self.args = TrainingArguments(
            output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=4, report_to="none"
        )
        self.state, self.control = TrainerState(), TrainerControl()
        config = tiny_vit_config()
        self.model = ViTForImageClassification(config).train()
        self.uint8 = input_s is not None
        if self.uint8:  # the device input path, attached before train begin as the recipe does
            _SlowPreprocessor(clock, input_s, config.image_size).attach(self.model)
        if model_forward_s:  # inside the model's own forward: its backward costs ~2x as much
            self.model.vit.embeddings.register_forward_hook(lambda *_: clock.sleep(model_forward_s))
        self.cb = ThroughputCallback(warmup_steps=warmup_steps, peak_tflops=1.0, print_table=False,
                                     teacher_config=teacher_config)  # fmt: skip
        self.cb.on_train_begin(self.args, self.state, self.control, model=self.model)

    def step(self, batch=4, extra_seconds=0.0, wait_before=0.0, evaluate_before=False):
        if evaluate_before:
            self.cb.on_evaluate(self.args, self.state, self.control)
        self.clock.sleep(wait_before)
        self.cb.on_step_begin(self.args, self.state, self.control)
        shape = (batch, 3, 8, 8)
        pixels = torch.randint(0, 256, shape, dtype=torch.uint8) if self.uint8 else torch.randn(shape)
        loss = self.model(pixel_values=pixels, labels=torch.zeros(batch, dtype=torch.long)).loss
        loss.backward()
        self.clock.sleep(STEP_COMPUTE_S + extra_seconds)
        self.cb.on_step_end(self.args, self.state, self.control)

    def report(self):
        self.state.is_world_process_zero = True
        self.cb.on_train_end(self.args, self.state, self.control)
        return self.cb.report


class _SlowPreprocessor(DevicePreprocessor):
    """The device input path, taking `seconds` of the fake clock per batch (resize + augmentation on the device)."""

    def __init__(self, clock, seconds, size):
        super().__init__(size, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
        self.clock, self.seconds = clock, seconds

    def __call__(self, pixels, train):
        self.clock.sleep(self.seconds)
        return super().__call__(pixels, train)


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


def test_device_input_hooks_are_not_counted_as_forward_and_the_sync_estimate_is_not_negative(tmp_path, clock):
    # Per step: 0.02 s of device preprocessing in the forward pre-hook (no backward), 0.004 s of model forward, then
    # STEP_COMPUTE_S of backward + optimizer. compute = 0.034 s; sync + optimizer = compute - input - 3 x forward.
    driver = _Driver(tmp_path, warmup_steps=0, clock=clock, input_s=0.02, model_forward_s=0.004)
    for _ in range(3):
        driver.step()
    report = driver.report()
    step, rank = report["step_time_s"], report["ranks"]["per_rank"][0]
    assert step["compute_mean"] == pytest.approx(0.034)
    assert rank["forward_mean_s"] == pytest.approx(0.004) and rank["input_hooks_mean_s"] == pytest.approx(0.02)
    assert step["est_sync_and_optimizer_mean"] == pytest.approx(0.034 - 0.02 - 3 * 0.004)
    assert rank["est_own_work_mean_s"] == pytest.approx(0.02 + 3 * 0.004)  # no data wait on the fake clock
    assert "-0." not in format_report(report)


def test_a_teacher_forward_is_counted_once_at_the_student_image_size(tmp_path, clock):
    """A resnet-tiny-cpu teacher (its config says 32 px) distilling into the 8 px student: its forward FLOPs are
    counted at 8 px, as FlopCounterMode counts a real ResNet there, and join the student's in the logged and the
    reported MFU."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForImageClassification

    from hf_vit_scaling.models.presets import preset_config

    teacher = preset_config("resnet-tiny-cpu", ["a", "b", "c"])
    assert teacher.image_size == 32
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        AutoModelForImageClassification.from_config(teacher).eval()(pixel_values=torch.zeros(1, 3, 8, 8))
    driver = _Driver(tmp_path, warmup_steps=0, clock=clock, teacher_config=teacher)
    for _ in range(3):
        driver.step()
    logs = {"loss": 1.0}
    driver.cb.on_log(driver.args, driver.state, driver.control, logs=logs)
    report = driver.report()
    flops = report["flops"]
    assert flops["teacher_forward_flops_per_image"] == counter.get_total_flops() > 0
    counted = flops["train_flops_per_image"] + flops["teacher_forward_flops_per_image"]
    images_per_s = report["throughput"]["images_per_s"]  # 12 images over 3 x STEP_COMPUTE_S of the fake clock
    assert flops["achieved_tflops_total"] == pytest.approx(images_per_s * counted / 1e12)
    assert flops["mfu"] == pytest.approx(images_per_s * counted / 1e12)  # one device, peak 1 TFLOP/s
    assert logs["throughput/mfu"] == pytest.approx(round(flops["mfu"], 5))
    assert flops["teacher_flops_fraction"] == pytest.approx(flops["teacher_forward_flops_per_image"] / counted)


class _FakeCudaEvent:
    """torch.cuda.Event on the fake clock: `record` notes the time, `elapsed_time` answers in ms, as CUDA's does."""

    syncs: list = []

    def __init__(self, enable_timing=False):
        self.at = None

    def record(self, stream=None):
        self.at = timing.time.perf_counter()

    def synchronize(self):
        _FakeCudaEvent.syncs.append("event")

    def elapsed_time(self, end) -> float:
        return (end.at - self.at) * 1000.0


def test_on_a_gpu_the_callback_waits_for_the_device_at_most_once_per_logging_window(tmp_path, clock, monkeypatch):
    """Each host wait for the device stalls the launch queue. Timing by CUDA events read at the logging step: at
    most one wait per window, and the same figures as the wall clock (fails on timing that synchronizes the device
    at every step boundary and around every forward: 5 waits a step)."""
    syncs = _FakeCudaEvent.syncs = []
    monkeypatch.setattr(torch.cuda, "Event", _FakeCudaEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: syncs.append("device"))
    drv = _Driver(tmp_path, warmup_steps=2, clock=clock)
    drv.cb.device_type, drv.cb.marks = "cuda", timing.StepMarks("cuda")  # a CUDA run, on the CPU
    monkeypatch.setattr(timing, "_memory", lambda *a: {"allocated_peak_bytes": 1, "reserved_peak_bytes": 1,
                                                       "rss_peak_bytes": 1})  # fmt: skip
    windows = 0
    for step in range(1, 13):
        drv.step(wait_before=0.002)
        if step % 4 == 0:  # logging_steps 4
            drv.cb.on_log(drv.args, drv.state, drv.control, logs={"loss": 1.0})
            windows += 1
    assert len(syncs) <= windows
    report = drv.report()
    assert len(syncs) <= windows + 1  # training's end reads the last steps (none here: 12 = 3 x 4)
    assert report["step_time_s"]["median"] == pytest.approx(STEP_COMPUTE_S + 0.002)
    assert report["step_time_s"]["data_wait_mean"] == pytest.approx(0.002)
