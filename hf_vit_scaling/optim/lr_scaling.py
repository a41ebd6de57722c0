"""Learning-rate scaling as the global batch grows.

The study (arXiv 2602.21081) kept lr = 1e-4 while the global batch grew 64 x N; its own logs show CIFAR-100
training accuracy after 5 epochs falling from 30% (1 GPU) to 7% (32 GPUs). Scale the lr with the batch instead:

- linear: lr = base_lr x B / B_ref (Goyal et al. 2017, "Accurate, Large Minibatch SGD", sec. 2.1), e.g.
  base 1e-4 tuned at B_ref = 64, 8 GPUs x 64 = 512 -> 1e-4 x 512 / 64 = 8e-4;
- sqrt: lr = base_lr x sqrt(B / B_ref) (Krizhevsky 2014; the rule for Adam-type optimizers in Malladi et al. 2022,
  "On the SDEs and Scaling Rules for Adaptive Gradient Algorithms"), e.g. 1e-4 x sqrt(8) = 2.83e-4;
both with a linear warmup (Goyal et al.: the large lr is reached gradually).
"""

import math

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.parallel.distributed import global_batch_size

LR_SCALING_RULES = ("none", "linear", "sqrt")
DEFAULT_SCALING_WARMUP = 0.05  # fraction of training steps, used when a rule is on and no warmup was given


def scaled_learning_rate(base_lr: float, global_batch: int, reference_batch: int, rule: str) -> float:
    if rule not in LR_SCALING_RULES:
        raise UserInputError(f"--lr_scaling {rule!r}: use one of {', '.join(LR_SCALING_RULES)}.")
    if reference_batch <= 0:
        raise UserInputError(f"--reference_batch_size must be positive, got {reference_batch}.")
    ratio = global_batch / reference_batch
    return {"none": base_lr, "linear": base_lr * ratio, "sqrt": base_lr * math.sqrt(ratio)}[rule]


def lr_for_global_batch(
    learning_rate: float,
    warmup_steps: float,
    per_device_batch: int,
    accumulation: int,
    world_size: int,
    rule: str,
    reference_batch: int,
    sequence_parallel_size: int = 1,
) -> dict:
    """The learning rate (and a warmup if none was given) for the run's global batch (N sequence-parallel ranks share
    their images: the batch counts world / N replicas): {"rule", "base_lr", "reference_batch", "global_batch", "lr",
    "warmup_steps"}; the caller gives the Trainer "lr" and "warmup_steps" (`training.run.prepare_world`). A DeepSpeed
    config's own optimizer block gets the same lr through `deepspeed_lr_values`."""
    global_batch = global_batch_size(per_device_batch, accumulation, world_size, sequence_parallel_size)
    if rule != "none" and not warmup_steps:
        warmup_steps = DEFAULT_SCALING_WARMUP
    return {
        "rule": rule,
        "base_lr": learning_rate,
        "reference_batch": reference_batch,
        "global_batch": global_batch,
        "lr": scaled_learning_rate(learning_rate, global_batch, reference_batch, rule),
        "warmup_steps": warmup_steps,
    }


def deepspeed_lr_values(lr_keys: tuple[str, ...], learning_rate: float) -> dict:
    """TrainingArguments already filled the DeepSpeed config's "auto" lr (offload configs carry an optimizer block):
    the scaled lr for the keys that carry it there (`Engine.reading.lr_keys`: "optimizer.params.lr",
    "scheduler.params.warmup_max_lr"), so DeepSpeed's optimizer gets the same value as the Trainer's."""
    return dict.fromkeys(lr_keys, learning_rate)
