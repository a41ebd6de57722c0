"""Tests `optim.build.Optimization`, the one builder of the optimizer and its schedule: what it leaves to the Trainer,
a schedule of `SCHEDULES` built through `VitTrainer.create_scheduler`, and the refusals."""

import pytest
import torch
from transformers import TrainingArguments, ViTConfig, ViTForImageClassification

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.optim import build
from hf_vit_scaling.optim.build import Optimization
from hf_vit_scaling.training.trainer import VitTrainer


def tiny_trainer(tmp_path, optimization=None, **args):
    config = ViTConfig(
        image_size=8,
        patch_size=4,
        num_channels=3,
        hidden_size=8,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=16,
        num_labels=2,
    )
    training = TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], learning_rate=1e-2, warmup_steps=2, **args
    )
    return VitTrainer(model=ViTForImageClassification(config), args=training, optimization=optimization)


def test_without_settings_the_trainer_builds_its_own(tmp_path):
    """Fails if the builder changes the Trainer's optimizer or schedule when no flag asks for it."""
    trainer = tiny_trainer(tmp_path)
    assert trainer.optimization.optimizer_cls_and_kwargs(trainer, trainer.model) is None
    assert trainer.optimization.scheduler(None, 10, 0, None) is None
    trainer.create_optimizer_and_scheduler(num_training_steps=10)
    assert type(trainer.optimizer).__name__ == "AdamW" and len(trainer.optimizer.param_groups) == 2
    assert type(trainer.lr_scheduler).__name__ == "LambdaLR"  # the Trainer's linear schedule
    assert trainer.layer_decay_report is None


def test_a_schedule_of_schedules_is_what_the_trainer_steps(tmp_path, monkeypatch):
    """Fails if a schedule registered in `SCHEDULES` (the one place a new schedule goes) is not the one
    `VitTrainer.create_scheduler` builds, with the Trainer's warmup and --lr_scheduler_kwargs."""
    seen = {}

    def halving(optimizer, num_warmup_steps, num_training_steps, every=1):
        seen.update(warmup=num_warmup_steps, steps=num_training_steps, every=every)
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=every, gamma=0.5)

    monkeypatch.setitem(build.SCHEDULES, "halving", halving)
    trainer = tiny_trainer(tmp_path, Optimization(lr_schedule="halving"), lr_scheduler_kwargs={"every": 3})
    trainer.create_optimizer_and_scheduler(num_training_steps=10)
    assert isinstance(trainer.lr_scheduler, torch.optim.lr_scheduler.StepLR)
    assert seen == {"warmup": 2, "steps": 10, "every": 3}


def test_an_unknown_schedule_is_refused():
    with pytest.raises(UserInputError, match="'nope'"):
        Optimization(lr_schedule="nope")


def test_layer_decay_groups_and_their_report(tmp_path):
    """Fails if --layer_decay's groups are not the optimizer's or the report is not attached to the Trainer."""
    trainer = tiny_trainer(tmp_path, Optimization(layer_decay=0.5))
    trainer.create_optimizer()
    lrs = sorted({round(g["lr"], 8) for g in trainer.optimizer.param_groups})
    assert lrs == [round(1e-2 * 0.5**k, 8) for k in (3, 2, 1, 0)]  # embeddings, block 0, block 1, head
    assert trainer.layer_decay_report is trainer.optimization.report and trainer.layer_decay_report.recorded


def test_the_lr_is_scaled_for_the_global_batch(tmp_path):
    args = TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], learning_rate=1e-3, per_device_train_batch_size=64
    )
    info = Optimization(lr_scaling="linear", reference_batch_size=32).scale_learning_rate(
        args.learning_rate,
        args.warmup_steps,
        args.per_device_train_batch_size,
        args.gradient_accumulation_steps,
        args.world_size,
    )
    assert info["lr"] == pytest.approx(2e-3) and info["rule"] == "linear" and info["global_batch"] == 64


def test_every_flag_of_the_learning_rate_group_is_a_setting_of_the_builder():
    """Fails if a flag added to `LearningRateArguments` (where a new schedule's flag goes) has no field of the same
    name in `Optimization`: `prepare_world` hands the group over by name, and the run would stop with a TypeError."""
    from dataclasses import asdict

    from hf_vit_scaling.arguments.engine import LearningRateArguments

    built = Optimization(**asdict(LearningRateArguments(lr_scaling="sqrt", reference_batch_size=64)))
    assert (built.lr_scaling, built.reference_batch_size) == ("sqrt", 64)
