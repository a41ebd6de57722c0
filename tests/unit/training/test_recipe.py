"""Tests `training.recipe`: the exit codes every recipe shares, and the Trainer's arguments built from the flags."""

import inspect
from types import SimpleNamespace

import pytest
from transformers import Trainer

from hf_vit_scaling.errors import CheckpointSaveError, TrainingInterrupted, TrainingStopped, UserInputError
from hf_vit_scaling.throughput.timing import ThroughputCallback
from hf_vit_scaling.training import recipe
from hf_vit_scaling.training.trainer import VitTrainer


def raising(err):
    def run(*args, **kwargs):
        raise err

    return run


@pytest.mark.parametrize(
    ("err", "code", "drained"),
    [
        (None, 0, False),
        (UserInputError("--x: bad. Fix: y."), 2, False),
        (TrainingStopped("non-finite loss"), 1, False),
        (CheckpointSaveError("save failed"), 1, False),
        (TrainingInterrupted("interrupted by SIGTERM"), 75, True),
    ],
)
def test_each_error_becomes_its_exit_code(monkeypatch, err, code, drained):
    """Fails if `exit_code_of` lets an error through, maps one to another code, or drains the process group after
    anything but an interruption (a stopped rank may be mid-collective)."""
    calls = []
    monkeypatch.setattr(recipe, "shutdown_distributed", lambda: calls.append("shutdown"))
    run = raising(err) if err is not None else (lambda argv: calls.append(argv))
    assert recipe.exit_code_of(run, ["--a"]) == code
    assert ("shutdown" in calls) is drained
    if err is None:
        assert calls == [["--a"]]  # the body ran with its arguments


def test_other_errors_are_tracebacks():
    """Fails if the boundary swallows a bug (a plain exception) into an exit code."""
    with pytest.raises(KeyError):
        recipe.exit_code_of(raising(KeyError("bug")))


def run_objects():
    args = SimpleNamespace(
        report=SimpleNamespace(throughput_warmup_steps=3, peak_tflops=None),
        cluster=SimpleNamespace(slow_ranks={1: 2.0}),
        engine=SimpleNamespace(sequence_parallel_size=1),
        reliability=SimpleNamespace(on_nonfinite_loss="skip", trace_samples=True, signals=("SIGTERM",)),
    )
    world = SimpleNamespace(engine="the engine", sequence_parallel=None, optimization="O")
    inputs = SimpleNamespace(splits={"train": "T", "validation": "V"}, collate="C", compute_metrics="M",
                             compute_loss_func="L", model_card={}, rank_batches=[4, 2], ema="E",
                             teacher_config=None)  # fmt: skip
    return args, world, inputs


def test_every_trainer_argument_is_one_the_trainer_takes():
    """Fails if a key of `trainer_arguments` or of the throughput settings is not a parameter of `VitTrainer`,
    the Trainer or the `ThroughputCallback` (a renamed feature would raise a TypeError in every recipe)."""
    kwargs = recipe.trainer_arguments(*run_objects())
    taken = {name for cls in (VitTrainer, Trainer) for name in inspect.signature(cls.__init__).parameters}
    assert set(kwargs) - taken == set()
    assert set(kwargs["throughput"]) - set(inspect.signature(ThroughputCallback.__init__).parameters) == set()


def test_the_flags_reach_the_trainer_arguments():
    """Fails if a flag's value or an input is dropped or swapped on its way to the Trainer."""
    kwargs = recipe.trainer_arguments(*run_objects())
    assert (kwargs["train_dataset"], kwargs["eval_dataset"], kwargs["data_collator"]) == ("T", "V", "C")
    assert (kwargs["nonfinite_policy"], kwargs["trace_samples"], kwargs["stop_signals"]) == (
        "skip",
        True,
        ("SIGTERM",),
    )
    assert (kwargs["optimization"], kwargs["ema"], kwargs["compute_loss_func"]) == ("O", "E", "L")
    assert kwargs["throughput"]["slow_ranks"] == {1: 2.0} and kwargs["throughput"]["rank_batches"] == [4, 2]
    assert kwargs["throughput"]["engine"] == "the engine" and kwargs["throughput"]["warmup_steps"] == 3
