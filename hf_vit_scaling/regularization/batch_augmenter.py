"""Batch regularization on the device: RandAugment / TrivialAugment (`rand_augment`), random erasing, Mixup / CutMix
with label smoothing (`mixing`), applied together by `BatchAugmenter`. timm's evaluation centre crop is
`data.device_transforms.EvalCenterCrop`.

Where it runs. The host path is unchanged: it hands over uint8 batches. On the device, `DevicePreprocessor` turns a
uint8 batch into normalised float pixels (random resized crop + flip) in a forward pre-hook on the model;
`BatchAugmenter.attach` adds a second pre-hook, registered after it, that augments that float batch, in training
only. `EvalCenterCrop.attach` adds a pre-hook registered *before* the preprocessor, for evaluation only.

Per-sample randomness. Every random choice is drawn per image, batched, from `generator` (None: the device's default
generator, which the Trainer seeds and saves in its checkpoints): RandAugment's op, magnitude and sign per image and
per layer; random erasing's box per image; Mixup's lam, CutMix's box and the Mixup-or-CutMix switch per image (timm's
`mode="elem"`; DeiT's default `"batch"` shares one lam per batch). kornia was measured and not used: its RandAugment
and TrivialAugment draw the operations once per batch (only magnitudes and signs per image), so every image of a batch
gets the same ops; see benchmarks/regularization_cost.py for the speed of both. The Trainer seeds every rank alike;
`training.seeding.PerRankRandomness` reseeds each data-parallel rank's default generator at train begin, so the
ranks draw different parameters (as the DevicePreprocessor's crops do), and the Trainer's per-rank checkpointed
generator states keep a resume exact.
Host-device synchronisations per training batch: one per RandAugment layer (the op group sizes), one for random
erasing (which images get noise), one or two for the Beta draws; nothing else waits for the device.

Order, as timm/DeiT apply them per image: RandAugment on [0, 1] pixels (the batch is un-normalised and normalised
again around it: two element-wise passes), random erasing on normalised pixels (noise ~ N(0, 1) there), then
Mixup/CutMix across the batch.

Labels. The forward pre-hook cannot see the labels (with `compute_loss_func` the Trainer keeps them out of the model),
so it records what it did: per image the weight lam of its own label and its partner in the batch. `loss`, given to
the Trainer as `compute_loss_func`, turns the hard labels into soft targets the way timm's `mixup_target` does: label
smoothing first, y = (1 - eps) one_hot + eps / C, then the mix y_i = lam_i y_i + (1 - lam_i) y_partner(i), and
computes soft-target cross-entropy. With `compute_loss_func` set the Trainer's own `LabelSmoother` never runs, so
smoothing is applied once. Evaluation forwards record nothing and get plain cross-entropy on hard labels (timm
evaluates with plain cross-entropy too).
"""

import math
from dataclasses import dataclass

import torch

from hf_vit_scaling.losses.soft_target import (
    mixes_images,
    produces_soft_targets,
    soft_target_cross_entropy,
    soft_targets,
)
from hf_vit_scaling.regularization.mixing import MixRecord, box_mask, mix_batch
from hf_vit_scaling.regularization.rand_augment import RandAugment, RandAugmentSpec, parse_rand_augment

# ---------------------------------------------------------------- RandAugment / TrivialAugment spec (timm's notation)


# ---------------------------------------------------------------- the ops, batched, on [0, 1] pixels
# Each op takes x (n, 3, H, W) in [0, 1], frac = m / 10 (n,), sign (n,) of +-1 (timm negates the argument of the
# geometric and "increasing" enhance ops with probability 1/2) and returns x in [0, 1]. The arguments follow timm's
# `LEVEL_TO_ARG`; the pixel operations follow PIL's (ImageOps, ImageEnhance), which timm calls.


# ---------------------------------------------------------------- random erasing (Zhong et al. 2020, timm's defaults)


def random_erasing(
    x: torch.Tensor, prob: float, generator=None, area=(0.02, 1 / 3), aspect=(0.3, 1 / 0.3), attempts: int = 10
) -> torch.Tensor:
    """With probability `prob` per image, replace one rectangle by per-pixel N(0, 1) noise (timm's mode 'pixel', as
    DeiT; on normalised pixels that is noise around the dataset mean). Area fraction ~ U(area), log aspect ~
    U(log aspect); h = round(sqrt(A r)), w = round(sqrt(A / r)); the first of `attempts` draws with h < H and w < W is
    used (none: the image is left alone), at a uniformly drawn position. Returns a new tensor."""
    n, _, height, width = x.shape
    dev = x.device
    target = (
        (torch.rand(n, attempts, device=dev, generator=generator) * (area[1] - area[0]) + area[0]) * height * width
    )
    log_low, log_high = math.log(aspect[0]), math.log(aspect[1])
    ratio = torch.exp(torch.rand(n, attempts, device=dev, generator=generator) * (log_high - log_low) + log_low)
    box_h, box_w = torch.sqrt(target * ratio).round(), torch.sqrt(target / ratio).round()
    fits = (box_h < height) & (box_w < width)
    first = fits.to(torch.uint8).argmax(dim=1, keepdim=True)  # the first attempt that fits (0 when none does)
    box_h, box_w = box_h.gather(1, first).squeeze(1), box_w.gather(1, first).squeeze(1)
    erase = fits.any(dim=1) & (torch.rand(n, device=dev, generator=generator) < prob)
    top = torch.floor(torch.rand(n, device=dev, generator=generator) * (height - box_h + 1))
    left = torch.floor(torch.rand(n, device=dev, generator=generator) * (width - box_w + 1))
    mask = box_mask(top, box_h, left, box_w, height, width).unsqueeze(1)
    # Noise only for the images erased (reading their indices is one host-device synchronisation).
    erased = torch.nonzero(erase).squeeze(1)
    out = x.clone()
    if erased.numel():
        noise = torch.randn((erased.numel(), *x.shape[1:]), device=dev, generator=generator, dtype=x.dtype)
        out[erased] = torch.where(mask[erased], noise, x[erased])
    return out


# ---------------------------------------------------------------- Mixup (Zhang et al. 2018), CutMix (Yun et al. 2019)


# ---------------------------------------------------------------- targets and the loss


@dataclass
class _TrainingForward:
    batch_size: int
    record: MixRecord | None  # None: this batch was not mixed


class BatchAugmenter:
    """Training-time batch augmentation on the device: (normalised pixels, labels) -> (pixels, soft targets).

    Use it as two hooks into the Trainer: `attach(model)` after `DevicePreprocessor.attach(model)`, and
    `Trainer(compute_loss_func=augmenter.loss)` when `produces_soft_targets`. Works on any float batch, so on the
    per-sample input path too. `generator` (optional) must live on the model's device.
    """

    def __init__(
        self,
        num_classes: int,
        mean,
        std,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        mixup_prob: float = 1.0,
        mixup_switch_prob: float = 0.5,
        label_smoothing: float = 0.0,
        rand_augment: str | RandAugmentSpec | None = None,
        random_erasing: float = 0.0,
        generator=None,
    ):
        self.num_classes = num_classes
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
        self.mixup_alpha, self.cutmix_alpha = mixup_alpha, cutmix_alpha
        self.mixup_prob, self.mixup_switch_prob = mixup_prob, mixup_switch_prob
        self.label_smoothing = label_smoothing
        if isinstance(rand_augment, str):
            rand_augment = parse_rand_augment(rand_augment)
        self.rand_augment = RandAugment(rand_augment, fill=mean) if rand_augment else None
        self.random_erasing = random_erasing
        self.generator = generator
        self._last: _TrainingForward | None = None
        self._handle = None

    @classmethod
    def from_arguments(cls, args, num_classes: int, mean, std, label_smoothing: float = 0.0, generator=None):
        """From `RegularizationArguments` (+ TrainingArguments.label_smoothing_factor)."""
        return cls(
            num_classes,
            mean,
            std,
            mixup_alpha=args.mixup_alpha,
            cutmix_alpha=args.cutmix_alpha,
            mixup_prob=args.mixup_prob,
            mixup_switch_prob=args.mixup_switch_prob,
            label_smoothing=label_smoothing,
            rand_augment=args.rand_augment,
            random_erasing=args.random_erasing,
            generator=generator,
        )

    @property
    def mixes(self) -> bool:
        return mixes_images(self.mixup_alpha, self.cutmix_alpha, self.mixup_prob)

    @property
    def produces_soft_targets(self) -> bool:
        """`losses.soft_target.produces_soft_targets`: the answer the flag checks and the loss choice share."""
        return produces_soft_targets(self.mixup_alpha, self.cutmix_alpha, self.mixup_prob, self.label_smoothing)

    @property
    def active(self) -> bool:
        """False: nothing to do (no hook, no loss function needed)."""
        return self.produces_soft_targets or self.rand_augment is not None or self.random_erasing > 0

    def augment(self, pixels: torch.Tensor) -> tuple[torch.Tensor, MixRecord | None]:
        """Normalised float pixels -> augmented pixels, and what Mixup/CutMix did (None: not mixed)."""
        with torch.no_grad():
            x = pixels
            if self.rand_augment is not None:
                mean, std = self.mean.to(x.device, x.dtype), self.std.to(x.device, x.dtype)
                x = (self.rand_augment((x * std + mean).clamp_(0.0, 1.0), self.generator) - mean) / std
            if self.random_erasing > 0:
                x = random_erasing(x, self.random_erasing, self.generator)
            record = None
            if self.mixes:
                x, record = mix_batch(
                    x, self.mixup_alpha, self.cutmix_alpha, self.mixup_prob, self.mixup_switch_prob, self.generator
                )
        return x, record

    def targets(self, labels: torch.Tensor, record: MixRecord | None) -> torch.Tensor:
        return soft_targets(labels, self.num_classes, self.label_smoothing, record)

    def __call__(self, pixels: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pixels, record = self.augment(pixels)
        return pixels, self.targets(labels, record)

    def attach(self, model: torch.nn.Module):
        """Forward pre-hook: training forwards get augmented pixels (and their mix is recorded for `loss`);
        evaluation forwards are untouched. Register after the DevicePreprocessor's hook (hooks run in order)."""

        def pre_hook(module, args, kwargs):
            pixels = kwargs.get("pixel_values")
            if not module.training or pixels is None:
                self._last = None
                return args, kwargs
            if pixels.dtype == torch.uint8:
                raise RuntimeError(
                    "BatchAugmenter got uint8 pixels: attach it after DevicePreprocessor.attach, so "
                    "that it runs on the normalised float batch."
                )
            kwargs["pixel_values"], record = self.augment(pixels)
            self._last = _TrainingForward(pixels.shape[0], record)
            return args, kwargs

        self._handle = model.register_forward_pre_hook(pre_hook, with_kwargs=True)
        return self._handle

    def training_targets(self, labels: torch.Tensor) -> torch.Tensor | None:
        """The soft targets of the training forward that just ran (smoothing + its recorded mix), taken so that
        each forward's record is used once; None after an evaluation forward (nothing recorded)."""
        if self._handle is None:
            raise RuntimeError("BatchAugmenter.loss needs the forward hook: call attach(model) first.")
        last, self._last = self._last, None
        if last is None:
            return None
        if last.batch_size != labels.shape[0]:
            raise RuntimeError(
                f"BatchAugmenter.loss: {labels.shape[0]} labels for a forward of "
                f"{last.batch_size} images; each training forward must be followed by its loss."
            )
        return self.targets(labels, last.record)

    def loss(self, outputs, labels: torch.Tensor, num_items_in_batch=None) -> torch.Tensor:
        """The Trainer's `compute_loss_func`: soft-target cross-entropy after a training forward (smoothing + the
        recorded mix), plain cross-entropy on hard labels after an evaluation forward."""
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
        targets = self.training_targets(labels)
        if targets is None:
            targets = soft_targets(labels, self.num_classes)
        return soft_target_cross_entropy(logits, targets, num_items_in_batch)


# ---------------------------------------------------------------- evaluation crop (timm's crop_pct)
