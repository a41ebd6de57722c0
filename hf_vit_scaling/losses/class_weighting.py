"""Class imbalance: inverse-frequency class weights and the weighted cross-entropy the Trainer calls.

With 1 tumour scan for every 4 healthy ones, the unweighted loss is lowest for a model that leans to "healthy": the
minority class's errors are a fifth of the gradient. Weighting each image's loss by its class weight gives both
classes the same total weight.

Weights (`balanced`, scikit-learn's `compute_class_weight("balanced")`, after King & Zeng 2001):
    w_c = N / (K * N_c)
N images, K classes, N_c images of class c. Each class's weights then sum to N / K, and the image-weighted mean
weight is sum_c N_c w_c / N = 1, so the loss keeps its usual scale and the learning rate needs no change.
Worked numbers, 1:4 (200 tumour, 800 healthy): w_tumour = 1000 / (2 * 200) = 2.5, w_healthy = 1000 / 1600 = 0.625.

Loss: sum_i w_{y_i} CE_i / n, with n the batch's image count, or the Trainer's `num_items_in_batch` (all ranks and
accumulation steps) so that it matches how transformers normalises the unweighted loss. This is not torch's
`cross_entropy(weight=...)` mean, which divides by sum_i w_{y_i}: that divisor changes from batch to batch, and in a
batch of one class it cancels the weights altogether.
"""

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.losses.reduction import reduce_per_image_loss

CLASS_WEIGHTING = ("none", "balanced")


def class_weights(labels: Sequence[int], num_classes: int) -> np.ndarray:
    """w_c = N / (K N_c) for c = 0..K-1 (see the module docstring); refuses a class with no training images."""
    counts = np.bincount(np.asarray(labels, dtype=np.int64), minlength=num_classes)[:num_classes]
    if (counts == 0).any():
        missing = np.flatnonzero(counts == 0).tolist()
        raise UserInputError(
            f"class(es) {missing} have no training images, so no class weight exists for them. Fix: add images of "
            "every class to the training split, or train without --class_weighting."
        )
    return counts.sum() / (num_classes * counts)


def weighted_cross_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    num_items_in_batch: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """sum_i w[y_i] * CE_i / n, n = `num_items_in_batch` or the batch size (see the module docstring)."""
    per_image = F.cross_entropy(logits.float(), labels, reduction="none")
    return reduce_per_image_loss(weights.to(per_image.device, per_image.dtype)[labels] * per_image, num_items_in_batch)


def make_weighted_loss(weights: Sequence[float]):
    """A `compute_loss_func(outputs, labels, num_items_in_batch)` for `Trainer(compute_loss_func=...)`."""
    weight_tensor = torch.as_tensor(np.asarray(weights), dtype=torch.float32)

    def compute_loss(outputs, labels, num_items_in_batch=None):
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
        return weighted_cross_entropy(logits, labels, weight_tensor, num_items_in_batch)

    compute_loss.class_weights = weight_tensor  # for logs and tests
    return compute_loss


def class_weighting_loss(mode: str, labels: Sequence[int], num_classes: int):
    """The recipe's --class_weighting: None for "none" (the model's own loss), else a weighted `compute_loss_func`."""
    if mode not in CLASS_WEIGHTING:
        raise UserInputError(f"--class_weighting {mode!r} is unknown. Fix: use one of {', '.join(CLASS_WEIGHTING)}.")
    if mode == "none":
        return None
    return make_weighted_loss(class_weights(labels, num_classes))
