"""`--stop_signals` in one process: a signal ends training at the step boundary with a complete checkpoint,
`output_dir/interrupted.json` and `TrainingInterrupted` (exit 75); the handlers are put back afterwards. Under
torchrun, Slurm and every engine: tests/launched/test_interruption_launched.py and tests/launched/test_slurm.py."""

import json
import os
import signal

import pytest
import torch
from transformers import TrainerCallback, TrainingArguments

from hf_vit_scaling.errors import INTERRUPTED_EXIT_CODE, TrainingInterrupted, UserInputError, exit_code_for
from hf_vit_scaling.training.checkpoints import checkpoint_problem
from hf_vit_scaling.training.faults import FAULTS_ENV
from hf_vit_scaling.training.interruption import INTERRUPTED_FILE, parse_stop_signals
from hf_vit_scaling.training.trainer import VitTrainer
from tests.unit.training.test_checkpoint_loading import tiny_model

DATA = [{"pixel_values": torch.randn(3, 16, 16), "labels": i % 3} for i in range(64)]


class SendAtStep(TrainerCallback):
    """Sends `sig` to this process as step `step` begins (after the stop callback's handlers are installed)."""

    def __init__(self, sig, step):
        self.sig, self.step = sig, step

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.step:
            os.kill(os.getpid(), self.sig)


class StepsRun(TrainerCallback):
    """The optimizer steps this trainer itself ran, in order (a resumed trainer's history holds the checkpoint's)."""

    def __init__(self):
        self.steps = []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)


def trainer(tmp_path, monkeypatch, stop_signals: str, max_steps: int = 8, save_steps: int = 4) -> VitTrainer:
    monkeypatch.delenv(FAULTS_ENV, raising=False)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none", max_steps=max_steps,
                             per_device_train_batch_size=4, save_steps=save_steps, disable_tqdm=True)  # fmt: skip
    return VitTrainer(
        model=tiny_model(0), args=args, train_dataset=DATA, stop_signals=parse_stop_signals(stop_signals)
    )


@pytest.mark.parametrize(
    ("spec", "expected"),
    [("SIGTERM,SIGUSR1", (signal.SIGTERM, signal.SIGUSR1)), ("term, usr1,TERM", (signal.SIGTERM, signal.SIGUSR1)),
     ("none", ()), ("NONE", ())],
)  # fmt: skip
def test_stop_signal_names(spec, expected):
    assert parse_stop_signals(spec) == expected


@pytest.mark.parametrize(("spec", "why"), [("SIGKILL", "cannot be caught"), ("SIGTERM,SIGFOO", "not a signal name"),
                                          (",", "names no signal")])  # fmt: skip
def test_bad_stop_signals_name_the_flag(spec, why):
    with pytest.raises(UserInputError, match=rf"--stop_signals .*{why}"):
        parse_stop_signals(spec)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_stops_at_that_step_with_a_complete_checkpoint(tmp_path, monkeypatch, sig):
    """Step 3 is off the save schedule (every 4): the stop saves checkpoint-3 itself, and nothing trains after it."""
    before = signal.getsignal(sig)
    run = trainer(tmp_path, monkeypatch, "SIGTERM,SIGUSR1")
    run.add_callback(SendAtStep(sig, 3))
    with pytest.raises(TrainingInterrupted) as stopped:
        run.train()
    out = tmp_path / "out"
    assert run.state.global_step == 3
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-3"]
    assert checkpoint_problem(str(out / "checkpoint-3")) is None
    record = json.loads((out / INTERRUPTED_FILE).read_text())
    assert (record["signal"], record["step"], record["complete"]) == (sig.name, 3, True)
    assert record["checkpoint"] == str(out / "checkpoint-3")
    assert f"interrupted by {sig.name} at step 3: saved {out / 'checkpoint-3'}" in str(stopped.value)
    assert exit_code_for(stopped.value) == INTERRUPTED_EXIT_CODE == 75
    assert signal.getsignal(sig) is before  # the process's own handler is back after training


def test_resuming_after_the_stop_trains_the_remaining_steps_to_the_same_weights(tmp_path, monkeypatch):
    """The resumed trainer runs steps 6-8 itself and ends with the uninterrupted run's weights. Fails if the resume
    is a restart (`train()` without `resume_from_checkpoint`: steps 1-8, the same weights from the same seed)."""
    reference = trainer(tmp_path / "ref", monkeypatch, "none")
    reference.train()
    stopped = trainer(tmp_path, monkeypatch, "SIGTERM")
    stopped.add_callback(SendAtStep(signal.SIGTERM, 5))
    with pytest.raises(TrainingInterrupted):
        stopped.train()
    resumed, ran = trainer(tmp_path, monkeypatch, "SIGTERM"), StepsRun()
    resumed.add_callback(ran)
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-5"))
    assert resumed.state.global_step == 8
    assert ran.steps == [6, 7, 8]  # not 1-8: weights alone cannot tell a resume from a restart
    for key, tensor in reference.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[key], tensor), key


def test_stop_signals_none_leaves_the_signal_alone(tmp_path, monkeypatch):
    """The contrast: without --stop_signals the process's SIGUSR1 handler (here one that records) sees the signal
    and training runs to its end."""
    seen = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(signum))
    try:
        run = trainer(tmp_path, monkeypatch, "none")
        run.add_callback(SendAtStep(signal.SIGUSR1, 3))
        run.train()
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert seen == [signal.SIGUSR1] and run.state.global_step == 8
    assert not (tmp_path / "out" / INTERRUPTED_FILE).exists()
