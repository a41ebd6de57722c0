"""Soft targets and the soft-target cross-entropy: label smoothing first, then Mixup/CutMix's mix (timm's
`mixup_target`, `SoftTargetCrossEntropy`)."""

import torch
import torch.nn.functional as F

from hf_vit_scaling.losses.reduction import reduce_per_image_loss


def mixes_images(mixup_alpha: float, cutmix_alpha: float, mixup_prob: float) -> bool:
    """Whether Mixup/CutMix mixes any batch: an alpha above 0 turns one on, and `mixup_prob` (the chance a batch is
    mixed) above 0 lets it act; with `mixup_prob` 0 no image is ever mixed, whatever the alphas."""
    return (mixup_alpha > 0 or cutmix_alpha > 0) and mixup_prob > 0


def produces_soft_targets(mixup_alpha: float, cutmix_alpha: float, mixup_prob: float, label_smoothing: float) -> bool:
    """Whether the run trains on soft targets: images are mixed (`mixes_images`) or labels smoothed. The one answer
    the flag checks, the batch augmenter and the choice of loss share: soft targets need the soft-target
    cross-entropy, hard ones may take the model's own loss or a class-weighted one."""
    return mixes_images(mixup_alpha, cutmix_alpha, mixup_prob) or label_smoothing > 0


def soft_targets(labels: torch.Tensor, num_classes: int, smoothing: float = 0.0, record=None) -> torch.Tensor:
    """(n, C) float targets: smoothed one-hot (1 - eps + eps/C on the label, eps/C elsewhere: each row sums to 1),
    then mixed with the partner's row as the pixels were (timm's `mixup_target`). `record`: Mixup/CutMix's
    `regularization.mixing.MixRecord` (each image's kept fraction `lam` and its `partner`), or None."""
    off = smoothing / num_classes
    targets = torch.full((labels.shape[0], num_classes), off, device=labels.device, dtype=torch.float32)
    targets.scatter_(1, labels.view(-1, 1).long(), 1.0 - smoothing + off)
    if record is not None:
        lam = record.lam.to(targets.device).view(-1, 1)
        targets = lam * targets + (1.0 - lam) * targets[record.partner.to(targets.device)]
    return targets


def soft_target_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, num_items_in_batch=None) -> torch.Tensor:
    """sum_c -targets_c log softmax(logits)_c per image, in float32; the mean over the batch, or, with
    `num_items_in_batch` (the Trainer's count over the whole accumulated, all-rank batch), the sum divided by it:
    the same reduction as transformers' `fixed_cross_entropy`, so the Trainer's loss scaling stays right."""
    per_image = -(targets * F.log_softmax(logits.float(), dim=-1)).sum(dim=-1)
    return reduce_per_image_loss(per_image, num_items_in_batch)
