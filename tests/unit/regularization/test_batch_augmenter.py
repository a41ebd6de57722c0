"""Tests `regularization.batch_augmenter`: per-sample randomness, random erasing, the loss through the Trainer."""

import pytest
import torch
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments

from hf_vit_scaling.data.device_transforms import DevicePreprocessor
from hf_vit_scaling.losses.soft_target import soft_target_cross_entropy, soft_targets
from hf_vit_scaling.regularization.batch_augmenter import BatchAugmenter, random_erasing
from hf_vit_scaling.regularization.mixing import mix_batch
from hf_vit_scaling.regularization.rand_augment import RandAugment, parse_rand_augment

MEAN = STD = (0.5, 0.5, 0.5)
NUM_CLASSES, SIZE = 10, 16  # the tiny_vit fixture's classes and image size


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def labelled_images(n: int, size: int = 16) -> torch.Tensor:
    """Image i is the constant i + 1: a pixel's value says which image it came from."""
    return (torch.arange(n, dtype=torch.float32) + 1).view(n, 1, 1, 1).expand(n, 3, size, size).clone()


def test_parameters_differ_across_the_batch_and_repeat_under_one_seed():
    n = 64
    rand_augment = RandAugment(parse_rand_augment("rand-m9-mstd0.5-inc1"))
    op, magnitude, sign = rand_augment.sample(n, generator=generator(0))
    assert len(op.unique()) > 8 and len(magnitude.unique()) > n // 2 and len(sign.unique()) == 2
    again = rand_augment.sample(n, generator=generator(0))
    assert all(torch.equal(a, b) for a, b in zip((op, magnitude, sign), again))
    assert not torch.equal(op, rand_augment.sample(n, generator=generator(1))[0])

    _, record = mix_batch(labelled_images(n), 0.8, 1.0, generator=generator(0))
    assert len(record.lam.unique()) > n // 2

    x = torch.zeros(n, 3, 32, 32)
    erased = random_erasing(x, 1.0, generator=generator(0)) != 0
    areas = erased[:, 0].sum(dim=(1, 2))
    assert len(areas.unique()) > n // 4  # one box per image, of its own size


def test_batch_augmenter_is_deterministic_under_a_seed():
    def run(seed):
        augmenter = BatchAugmenter(
            NUM_CLASSES,
            MEAN,
            STD,
            mixup_alpha=0.8,
            cutmix_alpha=1.0,
            label_smoothing=0.1,
            rand_augment="rand-m9-mstd0.5-inc1",
            random_erasing=0.25,
            generator=generator(seed),
        )
        pixels = torch.rand(16, 3, 16, 16, generator=generator(42)) * 2 - 1
        return augmenter(pixels, torch.arange(16) % NUM_CLASSES)

    (p0, t0), (p1, t1), (p2, _) = run(0), run(0), run(1)
    assert torch.equal(p0, p1) and torch.equal(t0, t1)
    assert not torch.equal(p0, p2)


def test_rand_augment_on_normalised_pixels_keeps_the_normalised_range():
    augmenter = BatchAugmenter(NUM_CLASSES, MEAN, STD, rand_augment="trivial", generator=generator(0))
    pixels = torch.rand(32, 3, 16, 16, generator=generator(1)) * 2 - 1  # normalised with mean = std = 0.5
    out, record = augmenter.augment(pixels)
    assert out.shape == pixels.shape and out.dtype == pixels.dtype and record is None
    assert out.min() >= -1 - 1e-6 and out.max() <= 1 + 1e-6
    assert (out != pixels).flatten(1).any(dim=1).float().mean() > 0.5  # TrivialAugment applies an op to each image


def test_random_erasing_replaces_one_box_per_image_within_timm_bounds():
    n, size = 200, 32
    x = torch.full((n, 3, size, size), 7.0)
    out = random_erasing(x, 1.0, generator=generator(0))
    changed = out[:, 0] != 7.0
    assert torch.equal(changed, (out != 7.0).all(dim=1))  # all channels of a pixel, or none
    area = changed.float().mean(dim=(1, 2))
    assert (area > 0).all()  # at 32 px a box always fits within 10 attempts
    rows, cols = changed.any(dim=2), changed.any(dim=1)
    assert torch.equal(changed.sum(dim=(1, 2)), rows.sum(1) * cols.sum(1))  # a rectangle
    h, w = rows.sum(1).float(), cols.sum(1).float()
    # area in [0.02, 1/3] of the image, aspect h / w in [0.3, 3.3], up to rounding h and w to whole pixels
    assert (area >= 0.02 * 0.7).all() and (area <= 1 / 3 * 1.3).all()
    assert ((h / w) >= 0.3 * 0.6).all() and ((h / w) <= 1 / 0.3 / 0.6).all()
    assert torch.equal(random_erasing(x, 0.0, generator=generator(0)), x)
    noise = out[changed.unsqueeze(1).expand_as(out)]
    assert abs(noise.mean().item()) < 0.05 and noise.std().item() == pytest.approx(1.0, abs=0.05)


def _uint8_batch(n: int = 8):
    pixels = torch.randint(0, 256, (n, 3, SIZE, SIZE), dtype=torch.uint8, generator=generator(0))
    return {"pixel_values": pixels, "labels": torch.arange(n) % NUM_CLASSES}


def test_trainer_uses_the_augmenter_loss_and_not_its_own_label_smoother(tiny_vit, tmp_path):
    """Training: soft targets smoothed once (the Trainer's LabelSmoother is bypassed); evaluation: plain CE."""
    DevicePreprocessor(SIZE, MEAN, STD, random_resized_crop=False, horizontal_flip=False).attach(tiny_vit)
    augmenter = BatchAugmenter(NUM_CLASSES, MEAN, STD, label_smoothing=0.1)
    augmenter.attach(tiny_vit)
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], label_smoothing_factor=0.1)
    trainer = Trainer(model=tiny_vit, args=args, compute_loss_func=augmenter.loss)
    batch = _uint8_batch()
    tiny_vit.train()
    torch.manual_seed(0)  # no dropout in vit-tiny-cpu; seeded anyway
    loss, outputs = trainer.compute_loss(tiny_vit, dict(batch), return_outputs=True)
    assert torch.allclose(loss, F.cross_entropy(outputs.logits, batch["labels"], label_smoothing=0.1))
    tiny_vit.eval()
    loss, outputs = trainer.compute_loss(tiny_vit, dict(batch), return_outputs=True)
    assert torch.allclose(loss, F.cross_entropy(outputs.logits, batch["labels"]))


def test_mixed_training_forward_gives_the_loss_of_its_recorded_mix(tiny_vit):
    DevicePreprocessor(SIZE, MEAN, STD).attach(tiny_vit)
    augmenter = BatchAugmenter(NUM_CLASSES, MEAN, STD, mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1)
    augmenter.attach(tiny_vit)
    batch = _uint8_batch()
    tiny_vit.train()
    outputs = tiny_vit(pixel_values=batch["pixel_values"])
    record = augmenter._last.record
    expected = soft_target_cross_entropy(outputs.logits, soft_targets(batch["labels"], NUM_CLASSES, 0.1, record))
    assert torch.allclose(augmenter.loss(outputs, batch["labels"]), expected)
    with pytest.raises(RuntimeError, match="4 labels for a forward of 8"):
        tiny_vit(pixel_values=batch["pixel_values"])
        augmenter.loss(outputs, batch["labels"][:4])


def test_augmenter_attached_before_the_preprocessor_is_refused(tiny_vit):
    BatchAugmenter(NUM_CLASSES, MEAN, STD, random_erasing=0.5).attach(tiny_vit)
    DevicePreprocessor(SIZE, MEAN, STD).attach(tiny_vit)
    tiny_vit.train()
    with pytest.raises(RuntimeError, match="attach it after DevicePreprocessor"):
        tiny_vit(pixel_values=_uint8_batch()["pixel_values"])


def test_evaluation_forwards_are_untouched(tiny_vit):
    DevicePreprocessor(SIZE, MEAN, STD).attach(tiny_vit)
    tiny_vit.eval()
    pixels = _uint8_batch()["pixel_values"]
    with torch.no_grad():
        before = tiny_vit(pixel_values=pixels).logits
        BatchAugmenter(NUM_CLASSES, MEAN, STD, mixup_alpha=1.0, rand_augment="trivial", random_erasing=1.0).attach(
            tiny_vit
        )
        after = tiny_vit(pixel_values=pixels).logits
    assert torch.equal(before, after)
