"""DeiT distillation (Touvron et al. 2021, "Training data-efficient image transformers & distillation through
attention"): a frozen teacher's logits on the student's own augmented batch, added to the label loss.

With n images, C classes, student heads s_cls and s_dist, teacher logits t and targets y (soft when Mixup/CutMix or
label smoothing make them: DeiT's base criterion is then SoftTargetCrossEntropy), as facebookresearch/deit
`losses.py` (`DistillationLoss.forward`) computes them:

- soft: (1 - λ) CE(s_cls, y) + λ τ² Σ_i Σ_c p_t,ic (log p_t,ic - log p_s,ic) / (n C), with p = softmax(logits / τ).
  DeiT divides the summed KL by `outputs_kd.numel()` = n C, not by n (batchmean), as asked in deit issue #116. Kept
  here, so the paper's soft setting, τ 3 and λ 0.1, means what it meant there; against a batchmean KL the term is
  1/C as large (10 classes: 0.1x).
- hard: (1 - λ) CE(s_cls, y) + λ CE(s_dist, argmax_c t), λ ½: DeiT's hard-label distillation.

A plain ViT student has one head: s_cls = s_dist = its logits (the class token learns from both). A student with a
distillation token (transformers' `DeiTForImageClassificationWithTeacher`) gives `cls_logits` and
`distillation_logits`; its `logits`, the average of the two, is what evaluation scores, as DeiT infers.

The per-image terms are reduced by `reduce_per_image_loss` (the batch mean, or the sum over the Trainer's global item
count), so gradient accumulation and data parallelism scale them as they scale the plain loss.
"""

import torch
import torch.nn.functional as F

from hf_vit_scaling.losses.reduction import reduce_per_image_loss
from hf_vit_scaling.losses.soft_target import soft_target_cross_entropy, soft_targets

DISTILLATION_TYPES = ("none", "soft", "hard")
# DeiT's values: soft τ 3, λ 0.1 (the paper's soft distillation); hard λ ½ (½ label CE + ½ teacher-argmax CE).
DEFAULT_ALPHA = {"soft": 0.1, "hard": 0.5}
DEFAULT_TAU = 3.0


def student_heads(outputs) -> tuple[torch.Tensor, torch.Tensor]:
    """(class-token logits, distillation-token logits): DeiT's two heads, or a one-head student's logits twice."""
    get = outputs.get if isinstance(outputs, dict) else (lambda key: getattr(outputs, key, None))
    cls_logits, dist_logits = get("cls_logits"), get("distillation_logits")
    if cls_logits is None or dist_logits is None:
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
        return logits, logits
    return cls_logits, dist_logits


def soft_distillation_per_image(student: torch.Tensor, teacher: torch.Tensor, tau: float) -> torch.Tensor:
    """τ² KL(softmax(t/τ) || softmax(s/τ)) per image, divided by C (DeiT's `numel` normalisation, see the module
    docstring), in float32."""
    log_p_student = F.log_softmax(student.float() / tau, dim=-1)
    log_p_teacher = F.log_softmax(teacher.float() / tau, dim=-1)
    kl = (log_p_teacher.exp() * (log_p_teacher - log_p_student)).sum(dim=-1)
    return kl * (tau * tau) / student.shape[-1]


def distillation_loss(
    outputs,
    targets: torch.Tensor,
    teacher_logits: torch.Tensor,
    kind: str,
    alpha: float,
    tau: float = DEFAULT_TAU,
    num_items_in_batch=None,
) -> torch.Tensor:
    """DeiT's loss (module docstring): `targets` (n, C) soft or one-hot rows, `teacher_logits` (n, C)."""
    cls_logits, dist_logits = student_heads(outputs)
    base = soft_target_cross_entropy(cls_logits, targets, num_items_in_batch)
    if kind == "soft":
        per_image = soft_distillation_per_image(dist_logits, teacher_logits, tau)
    elif kind == "hard":
        per_image = F.cross_entropy(dist_logits.float(), teacher_logits.argmax(dim=-1), reduction="none")
    else:
        raise ValueError(f"distillation type {kind!r}: expected soft or hard")
    return (1.0 - alpha) * base + alpha * reduce_per_image_loss(per_image, num_items_in_batch)


class DistillationLoss:
    """The Trainer's `compute_loss_func` with a teacher.

    `attach(model)` registers a forward pre-hook, after every input hook of the recipe (uint8 -> float, RandAugment,
    erasing, Mixup/CutMix), that keeps the pixels the student's training forward received; the loss then runs the
    teacher on exactly those pixels. `augmenter` (a BatchAugmenter, or None) gives the batch's soft targets when it
    makes them. After an evaluation forward (no pixels kept) the loss is plain cross-entropy on the student's
    `logits`, as without a teacher. The teacher is held here, never by the model the Trainer wraps: DeepSpeed and
    FSDP never see it, so it is neither partitioned nor in the optimizer.
    """

    def __init__(self, teacher, num_classes: int, kind: str, alpha: float, tau: float = DEFAULT_TAU, augmenter=None):
        self.teacher = teacher  # a Teacher (or anything with .logits(pixels))
        self.num_classes = num_classes
        self.kind, self.alpha, self.tau = kind, alpha, tau
        self.augmenter = augmenter if augmenter is not None and augmenter.produces_soft_targets else None
        self._pixels: torch.Tensor | None = None
        self._handle = None

    def attach(self, model: torch.nn.Module):
        """Register the pixel-keeping pre-hook: call it after the input hooks (hooks on a module run in order)."""

        def keep_pixels(module, args, kwargs):
            pixels = kwargs.get("pixel_values")
            self._pixels = pixels.detach() if module.training and pixels is not None else None
            return None

        self._handle = model.register_forward_pre_hook(keep_pixels, with_kwargs=True)
        return self._handle

    def __call__(self, outputs, labels: torch.Tensor, num_items_in_batch=None) -> torch.Tensor:
        if self._handle is None:
            raise RuntimeError("DistillationLoss needs the forward hook: call attach(model) first.")
        pixels, self._pixels = self._pixels, None
        targets = self.augmenter.training_targets(labels) if self.augmenter is not None else None
        if pixels is None:  # evaluation: the student's (averaged) logits against the hard labels
            logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
            return soft_target_cross_entropy(logits, soft_targets(labels, self.num_classes), num_items_in_batch)
        if targets is None:
            targets = soft_targets(labels, self.num_classes)
        teacher_logits = self.teacher.logits(pixels)
        return distillation_loss(outputs, targets, teacher_logits, self.kind, self.alpha, self.tau, num_items_in_batch)
