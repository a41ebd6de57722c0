"""Batch augmentations on the device: Mixup/CutMix targets, per-sample randomness, value ranges, PIL fidelity,
random erasing, the eval crop, and the loss path through the Trainer."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image, ImageEnhance, ImageOps
from transformers import Trainer, TrainingArguments

from hf_vit_scaling.data.device_transforms import DevicePreprocessor, EvalCenterCrop
from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.regularization.batch_augmenter import BatchAugmenter, random_erasing
from hf_vit_scaling.regularization.mixing import mix_batch, sample_beta, soft_target_cross_entropy, soft_targets
from hf_vit_scaling.regularization.rand_augment import (
    OP_FUNCTIONS,
    RAND_AUGMENT_OPS,
    RandAugment,
    RandAugmentSpec,
    parse_rand_augment,
)

MEAN = STD = (0.5, 0.5, 0.5)
NUM_CLASSES, SIZE = 10, 16  # the tiny_vit fixture's classes and image size


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def labelled_images(n: int, size: int = 16) -> torch.Tensor:
    """Image i is the constant i + 1: a pixel's value says which image it came from."""
    return (torch.arange(n, dtype=torch.float32) + 1).view(n, 1, 1, 1).expand(n, 3, size, size).clone()


# ---------------------------------------------------------------- Mixup / CutMix


@pytest.mark.parametrize("mixup_alpha, cutmix_alpha", [(0.0, 1.0), (0.8, 0.0), (0.8, 1.0)])
def test_mix_targets_sum_to_one_and_match_the_pixels_mixed(mixup_alpha, cutmix_alpha):
    n = 64
    x = labelled_images(n)
    mixed, record = mix_batch(x, mixup_alpha, cutmix_alpha, prob=0.8, switch_prob=0.5, generator=generator(0))
    own = x[:, 0, 0, 0].view(n, 1, 1)
    other = x[record.partner, 0, 0, 0].view(n, 1, 1)
    plane = mixed[:, 0]
    is_cut = ((plane == own) | (plane == other)).all(dim=(1, 2)) & ~(plane == plane[:, :1, :1]).all(dim=(1, 2))
    for i in range(n):
        if record.partner[i] == i:
            continue  # the middle image of an odd batch is its own partner
        if is_cut[i]:  # CutMix: the exact fraction of own pixels
            assert (plane[i] == own[i]).float().mean().item() == pytest.approx(record.lam[i].item(), abs=1e-6)
        else:  # Mixup (or not mixed, lam 1): every pixel lam x own + (1 - lam) x other
            lam = ((plane[i] - other[i]) / (own[i] - other[i])).flatten()
            assert torch.allclose(lam, record.lam[i].expand_as(lam), atol=1e-5)
    labels = torch.randint(0, NUM_CLASSES, (n,), generator=generator(1))
    targets = soft_targets(labels, NUM_CLASSES, smoothing=0.1, record=record)
    assert torch.allclose(targets.sum(dim=1), torch.ones(n), atol=1e-6)
    smooth = soft_targets(labels, NUM_CLASSES, smoothing=0.1)
    lam = record.lam.view(n, 1)
    assert torch.allclose(targets, lam * smooth + (1 - lam) * smooth[record.partner], atol=1e-6)


def test_mix_probability_zero_leaves_images_and_targets_alone():
    x = labelled_images(8)
    mixed, record = mix_batch(x, 0.8, 1.0, prob=0.0, generator=generator(0))
    assert torch.equal(mixed, x) and torch.equal(record.lam, torch.ones(8))


def test_label_smoothing_targets():
    targets = soft_targets(torch.tensor([2, 0]), 4, smoothing=0.2)
    assert torch.allclose(targets, torch.tensor([[0.05, 0.05, 0.85, 0.05], [0.85, 0.05, 0.05, 0.05]]))


def test_sample_beta_moments():
    for alpha in (0.2, 0.8, 1.0, 3.0):
        lam = sample_beta(alpha, 40_000, generator=generator(0))
        assert ((lam >= 0) & (lam <= 1)).all()
        # Beta(a, a): mean 1/2, variance 1 / (4 (2a + 1)).
        assert lam.mean().item() == pytest.approx(0.5, abs=0.01)
        assert lam.var().item() == pytest.approx(1 / (4 * (2 * alpha + 1)), rel=0.05)


# ---------------------------------------------------------------- per-sample randomness


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


# ---------------------------------------------------------------- RandAugment ops: shape, dtype, range, fidelity


@pytest.mark.parametrize("name", RAND_AUGMENT_OPS)
@pytest.mark.parametrize("increasing", [False, True])
def test_every_op_keeps_shape_dtype_and_range(name, increasing):
    x = torch.rand(6, 3, 20, 20, generator=generator(0))
    frac = torch.linspace(0, 1, 6)
    sign = torch.tensor([1.0, -1.0] * 3)
    y = OP_FUNCTIONS[name](x.clone(), frac, sign, increasing, torch.tensor(MEAN))
    assert y.shape == x.shape and y.dtype == x.dtype
    assert y.min() >= 0 and y.max() <= 1


def test_rand_augment_on_normalised_pixels_keeps_the_normalised_range():
    augmenter = BatchAugmenter(NUM_CLASSES, MEAN, STD, rand_augment="trivial", generator=generator(0))
    pixels = torch.rand(32, 3, 16, 16, generator=generator(1)) * 2 - 1  # normalised with mean = std = 0.5
    out, record = augmenter.augment(pixels)
    assert out.shape == pixels.shape and out.dtype == pixels.dtype and record is None
    assert out.min() >= -1 - 1e-6 and out.max() <= 1 + 1e-6
    assert (out != pixels).flatten(1).any(dim=1).float().mean() > 0.5  # TrivialAugment applies an op to each image


def _pil_image() -> Image.Image:
    rng = np.random.default_rng(0)
    array = (rng.random((32, 32, 3)) ** 2 * 200 + 20).astype(np.uint8)
    array[8:20, 5:25] = 240
    return Image.fromarray(array)


def _ours(image: Image.Image, name: str, frac: float, sign: float = 1.0, increasing: bool = False) -> np.ndarray:
    x = torch.from_numpy(np.array(image)).permute(2, 0, 1).float().div(255).unsqueeze(0)
    fill = torch.tensor([128 / 255] * 3)
    y = OP_FUNCTIONS[name](x, torch.tensor([frac]), torch.tensor([sign]), increasing, fill)
    return (y[0].permute(1, 2, 0) * 255).round().numpy()


def test_pixel_ops_match_pil_within_one_level():
    """timm runs these ops through PIL; ours agree to within one 8-bit level (rounding)."""
    image = _pil_image()
    m = 0.9  # magnitude 9 of 10
    expected = {
        ("AutoContrast", False): ImageOps.autocontrast(image),
        ("Equalize", False): ImageOps.equalize(image),
        ("Invert", False): ImageOps.invert(image),
        ("Posterize", False): ImageOps.posterize(image, int(4 * m)),
        ("Posterize", True): ImageOps.posterize(image, 4 - int(4 * m)),
        ("Solarize", False): ImageOps.solarize(image, int(256 * m)),
        ("Solarize", True): ImageOps.solarize(image, 256 - int(256 * m)),
        ("SolarizeAdd", False): image.point([min(255, i + int(110 * m)) if i < 128 else i for i in range(256)] * 3),
    }
    for name, enhancer in (
        ("Color", ImageEnhance.Color),
        ("Contrast", ImageEnhance.Contrast),
        ("Brightness", ImageEnhance.Brightness),
        ("Sharpness", ImageEnhance.Sharpness),
    ):
        expected[(name, False)] = enhancer(image).enhance(m * 1.8 + 0.1)
        expected[(name, True)] = enhancer(image).enhance(1.0 + m * 0.9)
    for (name, increasing), reference in expected.items():
        diff = np.abs(np.asarray(reference, dtype=float) - _ours(image, name, m, 1.0, increasing))
        assert diff.max() <= 1.0, (name, increasing, diff.max())


def test_geometric_ops_match_pil_on_average():
    """Bilinear warps agree with PIL's to about one level on average (they differ only along the image border)."""
    image = _pil_image()
    kw = dict(resample=Image.BILINEAR, fillcolor=(128, 128, 128))
    cases = {
        "ShearX": image.transform(image.size, Image.AFFINE, (1, 0.27, 0, 0, 1, 0), **kw),
        "ShearY": image.transform(image.size, Image.AFFINE, (1, 0, 0, 0.27, 1, 0), **kw),
        "TranslateXRel": image.transform(image.size, Image.AFFINE, (1, 0, 0.405 * 32, 0, 1, 0), **kw),
        "TranslateYRel": image.transform(image.size, Image.AFFINE, (1, 0, 0, 0, 1, 0.405 * 32), **kw),
        "Rotate": image.rotate(27, **kw),
    }
    for name, reference in cases.items():
        diff = np.abs(np.asarray(reference, dtype=float) - _ours(image, name, 0.9))
        assert diff.mean() < 1.5, (name, diff.mean())


# ---------------------------------------------------------------- random erasing


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


# ---------------------------------------------------------------- spec parsing


def test_parse_rand_augment_specs():
    deit = parse_rand_augment("rand-m9-mstd0.5-inc1")
    assert deit == RandAugmentSpec(num_ops=2, magnitude=9, magnitude_std=0.5, increasing=True, prob=0.5)
    assert parse_rand_augment("rand-n3-m7-p1.0-mmax12").num_ops == 3
    assert math.isinf(parse_rand_augment("rand-m9-mstd101").magnitude_std)
    trivial = parse_rand_augment("trivial")
    assert (trivial.num_ops, trivial.prob, trivial.increasing) == (1, 1.0, True)
    assert math.isinf(trivial.magnitude_std)
    for bad in ("autoaug-m9", "rand-q9", "rand-m9-mstd", "rand-n0", "rand-p1.5"):
        with pytest.raises(UserInputError, match="--rand_augment") as err:
            parse_rand_augment(bad)
        assert "Fix:" in str(err.value)


# ---------------------------------------------------------------- the loss, through the model and the Trainer


def test_soft_target_cross_entropy_matches_torch():
    logits = torch.randn(8, NUM_CLASSES, generator=generator(0))
    labels = torch.randint(0, NUM_CLASSES, (8,), generator=generator(1))
    one_hot = soft_targets(labels, NUM_CLASSES)
    assert torch.allclose(soft_target_cross_entropy(logits, one_hot), F.cross_entropy(logits, labels))
    smoothed = soft_targets(labels, NUM_CLASSES, smoothing=0.1)
    assert torch.allclose(
        soft_target_cross_entropy(logits, smoothed), F.cross_entropy(logits, labels, label_smoothing=0.1)
    )
    total = F.cross_entropy(logits, labels, reduction="sum")
    assert torch.allclose(soft_target_cross_entropy(logits, one_hot, torch.tensor(20)), total / 20)


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


# ---------------------------------------------------------------- evaluation crop


def test_eval_center_crop_is_timms_resize_then_centre_crop():
    crop = EvalCenterCrop(28, 0.875)
    assert crop.resized_shape(28, 28) == (32, 32)  # floor(28 / 0.875) = 32
    assert crop.resized_shape(28, 56) == (32, 64)  # the shorter side to 32, aspect kept
    pixels = torch.randint(0, 256, (2, 3, 28, 28), dtype=torch.uint8, generator=generator(0))
    out = crop(pixels)
    assert out.shape == (2, 3, 28, 28) and out.dtype == torch.uint8
    resized = F.interpolate(pixels.float(), size=(32, 32), mode="bilinear", antialias=True, align_corners=False)
    assert torch.equal(out, resized[..., 2:30, 2:30].round().clamp(0, 255).to(torch.uint8))
    assert torch.equal(EvalCenterCrop(28, 1.0)(pixels), pixels)


def test_eval_center_crop_hook_runs_before_the_preprocessor_in_evaluation_only(tiny_vit):
    DevicePreprocessor(SIZE, MEAN, STD, random_resized_crop=False, horizontal_flip=False).attach(tiny_vit)
    crop = EvalCenterCrop(SIZE, 0.875)
    pixels = torch.randint(0, 256, (4, 3, 24, 24), dtype=torch.uint8, generator=generator(0))
    with torch.no_grad():
        tiny_vit.eval()
        expected = tiny_vit(pixel_values=crop(pixels)).logits
        crop.attach(tiny_vit)  # prepended: runs before the preprocessor although attached after it
        assert torch.equal(tiny_vit(pixel_values=pixels).logits, expected)
        tiny_vit.train()
        assert not torch.allclose(tiny_vit(pixel_values=pixels).logits, expected)
