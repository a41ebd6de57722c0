"""The model's forward hooks, in one ordered place: what runs when in a training forward pass.

A training forward of `ViTForImageClassification(pixel_values=...)` runs these hooks, in this order:

| # | module          | hook                     | what it does                                                    |
|---|-----------------|--------------------------|-----------------------------------------------------------------|
| 1 | model, pre      | ThroughputCallback       | counts the batch's images, starts the input clock (prepended)   |
| 2 | model, pre      | EvalCenterCrop           | evaluation: timm's resize + centre crop of the uint8 batch      |
| 3 | model, pre      | DevicePreprocessor       | uint8 -> float at the model's size, augmentation, normalisation |
| 4 | model, pre      | BatchAugmenter           | training: RandAugment, erasing, Mixup/CutMix on 3's float batch |
|4b | model, pre      | DistillationLoss         | training: keeps 4's pixels: the loss runs the teacher on them   |
| 5 | model, pre      | SlowRankSimulator        | starts its clock (a SIMULATION for straggler studies)           |
| 6 | model, pre      | ThroughputCallback       | input clock stopped (2-5 are input time), forward clock started |
| 7 | embeddings      | ViTSequenceParallel      | pre: the group's pixels from its first rank; post: keep 1/N     |
| 8 | embeddings      | FaultInjector (tests)    | post, one step only: a NaN in the embeddings' output            |
| 9 | attention, mlp  | DropPath                 | post, training: each block's branches dropped per image         |
|10 | final norm      | ViTSequenceParallel      | pre: all-gather the sequence before the final LayerNorm         |
|11 | classifier      | ViTSequenceParallel      | post: scale the logits' gradient (the loss's) for ZeRO's mean   |
|12 | model, post     | SlowRankSimulator        | sleeps (factor - 1) x the forward, 2x that in the backward      |
|13 | model, post     | ThroughputCallback       | stops the forward clock (so 7-12 count as forward time)         |

Why this order: the throughput clock must see the batch as it arrives and include everything after it; device
preprocessing must turn uint8 into float before anything reads pixel values, and the batch augmentations work on
its float output (the eval crop works on the uint8 batch, so it is prepended before it); sequence parallelism must
see the final pixels (augmented per rank, so they are broadcast in the group). Hooks on one module run in registration
order, so `attach_model_hooks` registers 3-5 (4b after 4), 7 and 9 in that order (2 is prepended); 1, 6 and 13 come
from `ThroughputCallback.attach` at train begin (prepended pre-hook, last pre-hook, last post-hook); 8 is armed by the
trainer for one step. Evaluation runs hooks 2 and 3 (3 without augmentation); the others do nothing outside training.
None of them changes the saved model. The augmenter records each training batch's Mixup/CutMix so that
its loss (the Trainer's `compute_loss_func`) can build the matching soft targets.
"""

import torch

from hf_vit_scaling.regularization.drop_path import DropPath


def attach_model_hooks(
    model: torch.nn.Module,
    preprocessor=None,
    sequence_parallel=None,
    slow_rank=None,
    augmenter=None,
    eval_crop=None,
    drop_path_rate: float = 0.0,
    distillation=None,
) -> None:
    """Register the recipe's model hooks in the order the module docstring gives (each one optional)."""
    if preprocessor is not None:
        preprocessor.attach(model)
    if augmenter is not None:
        augmenter.attach(model)  # 4: after 3, on its float pixels; training only
    if distillation is not None:
        distillation.attach(model)  # 4b: after 4, so the teacher sees the student's final pixels
    if eval_crop is not None:
        eval_crop.attach(model)  # 2, prepended: before 3; evaluation only
    if drop_path_rate > 0:
        DropPath(model, drop_path_rate)  # post-hooks on each block's attention and mlp; training only
    if slow_rank is not None:
        slow_rank.attach(model)
    if sequence_parallel is not None:
        sequence_parallel.attach(model)  # hooks on submodules: run after every model-level pre-hook
