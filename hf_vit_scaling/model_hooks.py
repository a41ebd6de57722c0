"""The model's forward hooks, in one ordered place: what runs when in a training forward pass.

A training forward of `ViTForImageClassification(pixel_values=...)` runs these hooks, in this order:

| # | module         | hook                     | what it does                                                    |
|---|----------------|--------------------------|-----------------------------------------------------------------|
| 1 | model, pre     | ThroughputCallback       | counts the batch's images, starts the forward clock (prepended) |
| 2 | model, pre     | DevicePreprocessor       | uint8 -> float at the model's size, augmentation, normalisation |
| 3 | model, pre     | (batch augmentations)    | further device-side augmentations belong here, after 2           |
| 4 | model, pre     | SlowRankSimulator        | starts its clock (a SIMULATION for straggler studies)           |
| 5 | embeddings     | ViTSequenceParallel      | pre: the group's pixels from its first rank; post: keep 1/N     |
| 6 | embeddings     | FaultInjector (tests)    | post, one step only: a NaN in the embeddings' output            |
| 7 | final norm     | ViTSequenceParallel      | pre: all-gather the sequence before the final LayerNorm         |
| 8 | classifier     | ViTSequenceParallel      | post: scale the logits' gradient (the loss's) for ZeRO's mean   |
| 9 | model, post    | SlowRankSimulator        | sleeps (factor - 1) x the forward, 2x that in the backward      |
|10 | model, post    | ThroughputCallback       | stops the forward clock (so 2-9 count as forward time)          |

Why this order: the throughput clock must see the batch as it arrives and include everything after it; device
preprocessing must turn uint8 into float before anything reads pixel values; sequence parallelism must see the
final pixels (augmented per rank, so they are broadcast in the group). Hooks on one module run in registration
order, so `attach_model_hooks` registers 2-5 in that order; 1 and 10 come from `ThroughputCallback.attach` at
train begin (prepended pre-hook, last post-hook); 6 is armed by the trainer for one step. Evaluation runs hook 2
without augmentation; the others do nothing outside training. None of them changes the saved model.
"""

import torch


def attach_model_hooks(model: torch.nn.Module, preprocessor=None, sequence_parallel=None, slow_rank=None) -> None:
    """Register the recipe's model hooks in the order the module docstring gives (each one optional)."""
    if preprocessor is not None:
        preprocessor.attach(model)
    if slow_rank is not None:
        slow_rank.attach(model)
    if sequence_parallel is not None:
        sequence_parallel.attach(model)  # hooks on submodules: run after every model-level pre-hook
