"""Learning-rate scaling with the global batch: the rules, their refusals, and what `apply_lr_scaling` sets on the
training arguments (global batch with accumulation and sequence parallelism, a default warmup, DeepSpeed's lr)."""

from types import SimpleNamespace

import pytest

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.optim.lr_scaling import (
    DEFAULT_SCALING_WARMUP,
    apply_lr_scaling,
    deepspeed_lr_values,
    scaled_learning_rate,
)
from hf_vit_scaling.parallel.engine import Engine


def test_lr_scaling_rules():
    assert scaled_learning_rate(1e-4, 512, 64, "linear") == pytest.approx(8e-4)
    assert scaled_learning_rate(1e-4, 512, 64, "sqrt") == pytest.approx(1e-4 * 8**0.5)
    assert scaled_learning_rate(1e-4, 512, 64, "none") == 1e-4


def test_unknown_rule_and_reference_batch_are_refused():
    with pytest.raises(UserInputError, match="--lr_scaling 'cubic'"):
        scaled_learning_rate(1e-4, 512, 64, "cubic")
    with pytest.raises(UserInputError, match="--reference_batch_size must be positive"):
        scaled_learning_rate(1e-4, 512, 0, "linear")


def _training_args(**overrides):
    values = dict(
        per_device_train_batch_size=32, gradient_accumulation_steps=2, world_size=8, learning_rate=1e-4, warmup_steps=0
    )
    return SimpleNamespace(**(values | overrides))


def test_apply_counts_the_global_batch_and_adds_a_warmup():
    args = _training_args()
    info = apply_lr_scaling(args, "linear", reference_batch=64)
    assert info["global_batch"] == 32 * 2 * 8 == 512
    assert args.learning_rate == pytest.approx(8e-4) == info["lr"] and info["base_lr"] == 1e-4
    assert args.warmup_steps == DEFAULT_SCALING_WARMUP  # the large lr is reached gradually
    kept = _training_args(warmup_steps=100)
    apply_lr_scaling(kept, "sqrt", reference_batch=64)
    assert kept.warmup_steps == 100  # a warmup the user chose stands
    plain = _training_args()
    apply_lr_scaling(plain, "none", reference_batch=64)
    assert (plain.learning_rate, plain.warmup_steps) == (1e-4, 0)


def test_sequence_parallel_ranks_share_their_images():
    # 8 processes in SP groups of 4: 2 replicas, so the global batch is 32 x 2 x 8 / 4 = 128 images.
    args = _training_args()
    assert apply_lr_scaling(args, "linear", reference_batch=64, sequence_parallel_size=4)["global_batch"] == 128
    assert args.learning_rate == pytest.approx(2e-4)


def test_deepspeed_optimizer_and_scheduler_get_the_scaled_lr():
    """Offload configs carry an optimizer block whose "auto" lr TrainingArguments already filled: the run's engine
    sets the scaled lr there through `deepspeed_lr_values`, recording why."""
    config = {"optimizer": {"params": {"lr": 1e-4}}, "scheduler": {"params": {"warmup_max_lr": 1e-4}}}
    args = _training_args()
    apply_lr_scaling(args, "linear", reference_batch=64)
    engine = Engine("deepspeed", config)
    engine.set_values(deepspeed_lr_values(config, args.learning_rate), "--lr_scaling linear")
    assert config["optimizer"]["params"]["lr"] == args.learning_rate == pytest.approx(8e-4)
    assert config["scheduler"]["params"]["warmup_max_lr"] == args.learning_rate
    assert engine.resolved["optimizer.params.lr"] == {"value": args.learning_rate, "reason": "--lr_scaling linear"}
    assert deepspeed_lr_values({"zero_optimization": {"stage": 2}}, 1e-3) == {}  # no block of its own: nothing
