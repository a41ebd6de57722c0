"""Learning-rate scaling with the global batch: the rules, their refusals, and what `lr_for_global_batch` gives the
Trainer (global batch with accumulation and sequence parallelism, a default warmup, DeepSpeed's lr)."""

import pytest

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.optim.lr_scaling import (
    DEFAULT_SCALING_WARMUP,
    deepspeed_lr_values,
    lr_for_global_batch,
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


def _scaled(rule: str, warmup_steps: float = 0, sequence_parallel_size: int = 1) -> dict:
    """32 images per device x 2 accumulation x 8 processes at base lr 1e-4, tuned at 64 images."""
    return lr_for_global_batch(1e-4, warmup_steps, 32, 2, 8, rule, 64, sequence_parallel_size)


def test_the_global_batch_is_counted_and_a_warmup_added():
    info = _scaled("linear")
    assert info["global_batch"] == 32 * 2 * 8 == 512
    assert info["lr"] == pytest.approx(8e-4) and info["base_lr"] == 1e-4
    assert info["warmup_steps"] == DEFAULT_SCALING_WARMUP  # the large lr is reached gradually
    assert _scaled("sqrt", warmup_steps=100)["warmup_steps"] == 100  # a warmup the user chose stands
    plain = _scaled("none")
    assert (plain["lr"], plain["warmup_steps"]) == (1e-4, 0)


def test_sequence_parallel_ranks_share_their_images():
    # 8 processes in SP groups of 4: 2 replicas, so the global batch is 32 x 2 x 8 / 4 = 128 images.
    info = _scaled("linear", sequence_parallel_size=4)
    assert info["global_batch"] == 128 and info["lr"] == pytest.approx(2e-4)


def test_deepspeed_optimizer_and_scheduler_get_the_scaled_lr():
    """Offload configs carry an optimizer block whose "auto" lr TrainingArguments already filled: the run's engine
    sets the scaled lr there through `deepspeed_lr_values`, recording why."""
    config = {"optimizer": {"params": {"lr": 1e-4}}, "scheduler": {"params": {"warmup_max_lr": 1e-4}}}
    lr = _scaled("linear")["lr"]
    engine = Engine("deepspeed", config)
    engine.set_values(deepspeed_lr_values(engine.reading.lr_keys, lr), "--lr_scaling linear")
    assert config["optimizer"]["params"]["lr"] == lr == pytest.approx(8e-4)
    assert config["scheduler"]["params"]["warmup_max_lr"] == lr
    assert engine.resolved["optimizer.params.lr"] == {"value": lr, "reason": "--lr_scaling linear"}
    assert Engine("deepspeed", {"zero_optimization": {"stage": 2}}).reading.lr_keys == ()  # no block of its own
    assert deepspeed_lr_values((), 1e-3) == {}
