"""Tests `data.device_transforms`: uint8 batch transforms on the device against the per-sample ones; the eval crop."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from hf_vit_scaling.data.decoding import pil_to_uint8_tensor
from hf_vit_scaling.data.device_transforms import (
    DevicePreprocessor,
    EvalCenterCrop,
    collate_uint8_batch,
    random_crop_flip_theta,
)
from hf_vit_scaling.data.host_transforms import ImageTransform

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
HALF = (0.5, 0.5, 0.5)  # mean and std in the EvalCenterCrop tests
SIZE = 16  # the tiny_vit fixture's image size


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _images(n=6, side=12):
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8)) for _ in range(n)]


def test_device_eval_matches_per_sample_eval():
    images = _images()
    per_sample = torch.stack([ImageTransform(40, MEAN, STD, train=False)(img) for img in images])
    batch = collate_uint8_batch([{"pixel_values": pil_to_uint8_tensor(img), "labels": 0} for img in images])
    assert batch["pixel_values"].dtype == torch.uint8  # what crosses to the device: 3*12*12 bytes per image
    device = DevicePreprocessor(40, MEAN, STD)(batch["pixel_values"], train=False)
    torch.testing.assert_close(device, per_sample, atol=1e-5, rtol=1e-5)


def test_device_train_augments_per_sample():
    pixels = collate_uint8_batch([{"pixel_values": pil_to_uint8_tensor(img), "labels": 0} for img in _images(1) * 8])
    torch.manual_seed(0)
    out = DevicePreprocessor(16, MEAN, STD, crop_scale_min=0.3)(pixels["pixel_values"], train=True)
    assert out.shape == (8, 3, 16, 16)
    assert not torch.allclose(out[0], out[1])  # same image, different crops


def test_flip_only_mirrors_exactly():
    pixels = pil_to_uint8_tensor(_images(1, side=16)[0]).unsqueeze(0).repeat(64, 1, 1, 1)
    prep = DevicePreprocessor(16, MEAN, STD, random_resized_crop=False, horizontal_flip=True)
    torch.manual_seed(1)
    out = prep(pixels, train=True)
    plain = prep(pixels[:1], train=False)[0]
    flipped = [torch.allclose(o, plain.flip(-1), atol=1e-5) for o in out]
    kept = [torch.allclose(o, plain, atol=1e-5) for o in out]
    assert all(f or k for f, k in zip(flipped, kept)) and 10 < sum(flipped) < 54


def _shifts_found(image: torch.Tensor, shifted: torch.Tensor, padding: int) -> list[tuple[int, int]]:
    """The whole-pixel shifts (dy, dx) in [-padding, padding] that turn `image` (C, H, W) into `shifted`, edges
    repeated: shifted[y, x] = image[clamp(y + dy), clamp(x + dx)]."""
    side = image.shape[-1]
    found = []
    for dy in range(-padding, padding + 1):
        for dx in range(-padding, padding + 1):
            rows = (torch.arange(side) + dy).clamp(0, side - 1)
            cols = (torch.arange(side) + dx).clamp(0, side - 1)
            if torch.allclose(image[:, rows][:, :, cols], shifted, atol=1e-4):
                found.append((dy, dx))
    return found


@pytest.mark.parametrize("path", ["device", "per_sample"])
def test_random_crop_padding_shifts_by_whole_pixels_with_edges_repeated(path):
    side, padding = 16, 3
    image = torch.arange(side * side, dtype=torch.uint8).view(1, side, side).expand(3, side, side).contiguous()
    torch.manual_seed(0)
    if path == "device":
        prep = DevicePreprocessor(side, [0.0] * 3, [1.0] * 3, random_resized_crop=False, horizontal_flip=False,
                                  padding=padding)  # fmt: skip
        outputs = prep(image.expand(32, 3, side, side), train=True)
    else:
        prep = ImageTransform(side, [0.0] * 3, [1.0] * 3, True, random_resized_crop=False, horizontal_flip=False,
                              padding=padding)  # fmt: skip
        outputs = torch.stack([prep(image) for _ in range(32)])
    reference = image.float() / 255.0
    shifts = [_shifts_found(reference, out, padding) for out in outputs]
    assert all(len(found) == 1 for found in shifts)  # each output is exactly one whole-pixel shift, no blur
    assert len({found[0] for found in shifts}) > 8  # drawn per image
    assert {dy for ((dy, _),) in shifts} == set(range(-padding, padding + 1))  # the whole range, and no further


def test_random_crop_padding_leaves_evaluation_alone():
    image = torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8)
    prep = DevicePreprocessor(16, [0.0] * 3, [1.0] * 3, random_resized_crop=False, padding=4)
    # x * (1 / 255) on the device, x / 255 on the host: equal within float rounding, never shifted
    assert torch.allclose(prep(image, train=False), image.float() / 255.0, rtol=0, atol=1e-6)
    assert ImageTransform(16, [0.0] * 3, [1.0] * 3, False, padding=4)(image[0]).equal(image[0].float() / 255.0)


def test_crop_boxes_respect_scale_and_stay_inside():
    theta = random_crop_flip_theta(1000, 0.25, flip=False, generator=torch.Generator().manual_seed(0))
    w, h, cx, cy = theta[:, 0, 0], theta[:, 1, 1], theta[:, 0, 2], theta[:, 1, 2]
    inside = (w < 1) & (h < 1)  # boxes not clamped at the image border keep their sampled area
    assert inside.float().mean() > 0.5 and (w * h)[inside].min() >= 0.25 - 1e-6
    assert ((cx.abs() + w) <= 1 + 1e-6).all() and ((cy.abs() + h) <= 1 + 1e-6).all()


def test_uint8_batches_of_hwc_views_stack_without_transposing_and_preprocess_the_same():
    images = [pil_to_uint8_tensor(img) for img in _images(4, side=10)]  # views of H x W x 3 arrays
    batch = collate_uint8_batch([{"pixel_values": p, "labels": 0} for p in images])["pixel_values"]
    assert batch.shape == (4, 3, 10, 10) and batch.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(batch, torch.stack(images))
    prep = DevicePreprocessor(16, MEAN, STD)
    out = prep(batch, train=False)
    assert out.is_contiguous() and torch.equal(out, prep(torch.stack(images).contiguous(), train=False))
    window = [p[:, 2:8, 1:9] for p in images]  # windows of those arrays (a host-side crop) stack the same way
    stacked = collate_uint8_batch([{"pixel_values": p, "labels": 0} for p in window])["pixel_values"]
    assert stacked.is_contiguous(memory_format=torch.channels_last) and torch.equal(stacked, torch.stack(window))


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
    DevicePreprocessor(SIZE, HALF, HALF, random_resized_crop=False, horizontal_flip=False).attach(tiny_vit)
    crop = EvalCenterCrop(SIZE, 0.875)
    pixels = torch.randint(0, 256, (4, 3, 24, 24), dtype=torch.uint8, generator=generator(0))
    with torch.no_grad():
        tiny_vit.eval()
        expected = tiny_vit(pixel_values=crop(pixels)).logits
        crop.attach(tiny_vit)  # prepended: runs before the preprocessor although attached after it
        assert torch.equal(tiny_vit(pixel_values=pixels).logits, expected)
        tiny_vit.train()
        assert not torch.allclose(tiny_vit(pixel_values=pixels).logits, expected)


@pytest.mark.parametrize("padding", [0, 3])
def test_mirrors_and_shifts_without_a_crop_equal_grid_sample(padding):
    """host_crop's device half (no crop: flips and whole-pixel shifts) gathers indices instead of resampling: the
    same values as the bilinear grid_sample it replaces, from the same random draws."""
    side = 24
    pixels = torch.randint(0, 256, (32, 3, side, side), dtype=torch.uint8)
    prep = DevicePreprocessor(side, MEAN, STD, random_resized_crop=False, horizontal_flip=True, padding=padding)
    torch.manual_seed(3)
    got = prep(pixels, train=True)
    torch.manual_seed(3)
    theta = random_crop_flip_theta(32, None, True, None, None, padding, side)
    grid = torch.nn.functional.affine_grid(theta, [32, 3, side, side], align_corners=False)
    x = torch.nn.functional.grid_sample(pixels.float() / 255.0, grid, mode="bilinear", padding_mode="border",
                                        align_corners=False)  # fmt: skip
    expected = (x - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    assert torch.allclose(got, expected, rtol=0, atol=1e-5)
    assert got.is_contiguous()
