"""The one reduction every per-image loss of the recipes uses, so the Trainer's loss scaling stays right."""

import torch


def reduce_per_image_loss(per_image: torch.Tensor, num_items_in_batch=None) -> torch.Tensor:
    """The batch mean, or, with `num_items_in_batch` (the Trainer's count over the whole accumulated, all-rank batch),
    the sum divided by it: the reduction of transformers' `fixed_cross_entropy`."""
    if num_items_in_batch is None:
        return per_image.mean()
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(per_image.device)
    return per_image.sum() / num_items_in_batch
