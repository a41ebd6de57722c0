"""The host-crop input path (`crop_decode`): variable-size images become fixed-size uint8 crops whose content is
that of the same crop of the full-size decode, JPEGs decoded at reduced size only when the crop keeps its detail."""

import io

import numpy as np
import pytest
import torch
from PIL import Image

from hf_vit_scaling.arguments.data import DataArguments
from hf_vit_scaling.data.crop_decode import (
    CropDecoder,
    attach_host_crop_transforms,
    crop_resize_uint8,
    jpeg_reduction,
)
from hf_vit_scaling.data.decoding import pil_to_uint8_tensor
from hf_vit_scaling.data.device_transforms import DevicePreprocessor, EvalCenterCrop, collate_uint8_batch
from hf_vit_scaling.data.host_transforms import random_resized_crop_box
from hf_vit_scaling.data.loading import load_image_classification_data
from tests.helpers.builders import MAGENTA_CMYK, NOT_AN_IMAGE, jpeg_bytes, make_image_folder, smooth_image

# Mean / max absolute difference, in levels of 255, allowed between a crop decoded at reduced size (libjpeg's scaled
# IDCT, then torch's resize of the rounded box) and the same crop of the full-size decode resized by PIL: measured at
# most 0.9 / 4 on these images.
MEAN_TOL, MAX_TOL = 1.5, 8


def _stored(data: bytes) -> dict:
    return {"bytes": data, "path": None}


def _reference(image: Image.Image, box, size: int) -> torch.Tensor:
    """The crop of the full-size decode, resized as PIL does (bilinear, antialiased)."""
    return pil_to_uint8_tensor(image.convert("RGB").resize((size, size), Image.Resampling.BILINEAR, box=box))


def _assert_close(out: torch.Tensor, reference: torch.Tensor) -> None:
    diff = (out.int() - reference.int()).abs()
    assert diff.float().mean() < MEAN_TOL and diff.max() <= MAX_TOL, (diff.float().mean(), diff.max())


def test_jpeg_reduction_keeps_at_least_the_output_size():
    assert jpeg_reduction((2000, 1500), (0, 0, 2000, 1500), (224, 224)) == 4  # 1500 // 224 = 6 -> 1/4
    assert jpeg_reduction((500, 375), (0, 0, 500, 375), (224, 224)) == 1  # ImageNet-sized: no reduction
    assert jpeg_reduction((2000, 1500), (100, 100, 600, 600), (224, 224)) == 2  # a 500 px box: 1/2 keeps 250 px
    assert jpeg_reduction((100, 80), (0, 0, 100, 80), (224, 224)) == 1  # smaller than the output: full size
    rng = np.random.default_rng(0)
    for _ in range(200):
        w, h = rng.integers(50, 3000, 2)
        bw, bh = rng.integers(1, w + 1), rng.integers(1, h + 1)
        reduction = jpeg_reduction((w, h), (0, 0, bw, bh), (64, 64))
        assert reduction == 1 or (bw / reduction >= 64 and bh / reduction >= 64)


def test_eval_resizes_the_whole_image_decoded_at_reduced_size():
    image = smooth_image(640, 480)
    data = jpeg_bytes(image)
    assert jpeg_reduction(image.size, (0, 0, 640, 480), (64, 64)) == 4  # decoded at 160 x 120
    out, reason = CropDecoder(64, train=False)(_stored(data))
    assert reason is None and out.dtype == torch.uint8 and out.shape == (3, 64, 64) and out.is_contiguous()
    _assert_close(out, _reference(Image.open(io.BytesIO(data)), (0, 0, 640, 480), 64))


def test_training_crops_match_the_same_crop_of_the_full_decode():
    data = jpeg_bytes(smooth_image(900, 700, seed=3))
    full = Image.open(io.BytesIO(data)).convert("RGB")
    decoder = CropDecoder(48, train=True, random_resized_crop=True, crop_scale_min=0.3)
    reduced = 0
    for seed in range(6):
        torch.manual_seed(seed)
        out, reason = decoder(_stored(data))
        torch.manual_seed(seed)  # the same draw: the path uses the per-sample path's sampler and RNG
        top, left, h, w = random_resized_crop_box(700, 900, 0.3)
        box = (left, top, left + w, top + h)
        reduced += jpeg_reduction((900, 700), box, (48, 48)) > 1
        assert reason is None and out.shape == (3, 48, 48)
        _assert_close(out, _reference(full, box, 48))
    assert reduced >= 3  # most of these crops decode at 1/2 or less


def test_eval_crop_pct_matches_the_device_centre_crop():
    image = smooth_image(300, 200, seed=5)
    data = jpeg_bytes(image)
    out, _ = CropDecoder(32, train=False, eval_crop_pct=0.875)(_stored(data))
    full = pil_to_uint8_tensor(Image.open(io.BytesIO(data)))
    _assert_close(out, EvalCenterCrop(32, 0.875)(full.unsqueeze(0))[0])


def test_grayscale_cmyk_and_png_become_rgb_crops():
    gray = jpeg_bytes(smooth_image(80, 60).convert("L"))
    out, _ = CropDecoder(16, train=False)(_stored(gray))
    assert out.shape == (3, 16, 16) and torch.equal(out[0], out[1]) and torch.equal(out[1], out[2])
    cmyk = io.BytesIO()
    Image.new("CMYK", (40, 30), MAGENTA_CMYK).save(cmyk, format="JPEG", quality=95)
    out, _ = CropDecoder(16, train=False)(_stored(cmyk.getvalue()))
    assert (out.int() - torch.tensor([255, 0, 255]).view(3, 1, 1)).abs().max() <= 3
    png = io.BytesIO()
    Image.new("RGBA", (20, 30), (10, 200, 30, 128)).save(png, format="PNG")
    out, _ = CropDecoder(16, train=False)(_stored(png.getvalue()))
    assert out.shape == (3, 16, 16) and out[:, 0, 0].tolist() == [10, 200, 30]


def test_undecodable_images_are_named_not_raised():
    out, reason = CropDecoder(16, train=True)(_stored(b"not an image"))
    assert out is None and reason.startswith("UnidentifiedImageError")
    out, reason = CropDecoder(16, train=True)(_stored(NOT_AN_IMAGE))  # starts like a JPEG
    assert out is None and reason.startswith("OSError")
    whole = jpeg_bytes(smooth_image(64, 64))
    out, reason = CropDecoder(16, train=True)(_stored(whole[: len(whole) // 2]))
    assert out is None and reason.startswith("OSError")


@pytest.mark.parametrize("train", [True, False])
def test_variable_size_folder_gives_fixed_size_uint8_batches_for_the_device(tmp_path, train):
    make_image_folder(tmp_path / "train", [("RGB", (20, 12)), ("L", (9, 9)), ("RGBA", (16, 40)), ("RGB", (64, 64))])
    args = DataArguments(train_dir=str(tmp_path / "train"), train_val_split=0.25)
    data = load_image_classification_data(args, seed=0)
    split = attach_host_crop_transforms(data, 8, args)["train" if train else "validation"]
    batch = collate_uint8_batch([split[i] for i in range(len(split))])
    assert batch["pixel_values"].dtype == torch.uint8 and batch["pixel_values"].shape == (len(split), 3, 8, 8)
    out = DevicePreprocessor(8, [0.5] * 3, [0.5] * 3, random_resized_crop=False)(batch["pixel_values"], train=train)
    assert out.shape == (len(split), 3, 8, 8) and out.dtype == torch.float32


@pytest.mark.parametrize("region", [(40, 30), (120, 90), (300, 60), (300, 280)], ids=str)
def test_resize_equals_the_antialiased_kernel_for_enlarged_shrunk_and_mixed_boxes(region):
    """Plain bilinear for boxes enlarged on both sides (the cheaper kernel) and antialiased bilinear otherwise give
    exactly the bytes of antialiased bilinear on every box."""
    width, height = region
    pixels = np.random.default_rng(width).integers(0, 256, (height + 10, width + 10, 3), dtype=np.uint8)
    box = (5, 5, 5 + width, 5 + height)
    out = crop_resize_uint8(Image.fromarray(pixels), box, 112)
    region_chw = torch.from_numpy(pixels[5 : 5 + height, 5 : 5 + width]).permute(2, 0, 1).unsqueeze(0)
    expected = torch.nn.functional.interpolate(
        region_chw, size=(112, 112), mode="bilinear", antialias=True, align_corners=False
    )[0]
    assert out.dtype == torch.uint8 and out.shape == (3, 112, 112) and out.is_contiguous()
    assert torch.equal(out, expected)
