"""Decoding stored images without letting one bad file fail a batch: decode / try_decode, find_bad_images, the
--on_bad_image fail pre-scan naming the file, and the collate bookkeeping that drops bad rows; 16-bit grayscale
scaled to 8 bit; prepared shards' raw rows."""

import io

import numpy as np
import pytest
import torch
from datasets import Dataset, Features
from datasets import Image as ImageFeature
from PIL import Image

from hf_vit_scaling.arguments.data import DataArguments
from hf_vit_scaling.data.decoding import (
    decode_image,
    decode_raw,
    drop_bad_examples,
    find_bad_images,
    to_gray,
    to_rgb,
    try_decode_image,
)
from hf_vit_scaling.data.decoding import stack_batch as collate_image_batch
from hf_vit_scaling.data.host_transforms import attach_transforms
from hf_vit_scaling.data.loading import load_image_classification_data
from hf_vit_scaling.errors import UserInputError
from tests.helpers.builders import GRAY16, GRAY16_AS_8BIT, MIXED, NOT_AN_IMAGE, TRUNCATED_BYTES, make_image_folder


def _png_bytes() -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.arange(64, dtype=np.uint8).reshape(8, 8)).save(buffer, format="PNG")
    return buffer.getvalue()


def _noise_png_bytes() -> bytes:
    """32x32 random RGB: about 3 KB that does not compress, so a cut after the header loses pixel data."""
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_decoding_names_truncated_and_garbage_files():
    good = _png_bytes()
    image, reason = try_decode_image({"bytes": good, "path": None})
    assert reason is None and image.size == (8, 8)
    assert try_decode_image({"bytes": good[:40], "path": "cut.png"})[0] is None
    assert "UnidentifiedImageError" in try_decode_image({"bytes": b"not an image", "path": None})[1]


def test_decode_loads_the_pixels_now_and_passes_pil_images_through(tmp_path):
    (tmp_path / "cut.png").write_bytes(_noise_png_bytes()[:TRUNCATED_BYTES])
    assert Image.open(tmp_path / "cut.png").size == (32, 32)
    with pytest.raises(OSError):  # the header opens; the truncated pixel data fails here, not in a transform
        decode_image({"bytes": None, "path": str(tmp_path / "cut.png")})
    image = Image.new("RGB", (3, 2))
    assert decode_image(image) is image
    assert "neither bytes nor a path" in try_decode_image({"bytes": None, "path": None})[1]


def test_find_bad_images_names_each_bad_row():
    good = _noise_png_bytes()
    values = [
        {"bytes": good, "path": None},
        {"bytes": NOT_AN_IMAGE, "path": "garbage.jpg"},
        {"bytes": good, "path": None},
        {"bytes": good[:TRUNCATED_BYTES], "path": None},
    ]
    split = Dataset.from_dict({"img": values}, features=Features({"img": ImageFeature(decode=False)}))
    bad = find_bad_images(split, "img")
    assert [b["sample"] for b in bad] == ["'garbage.jpg'", "row 3"]  # a path when there is one, else the row
    assert all(b["reason"].startswith(("OSError: ", "UnidentifiedImageError: ")) for b in bad)  # why, by class
    assert find_bad_images(split, "img", first_only=True) == bad[:1]


def test_corrupt_image_is_named(tmp_path):
    make_image_folder(tmp_path / "train", MIXED[:2], corrupt=["broken.jpg"])
    with pytest.raises(UserInputError, match="broken.jpg"):
        load_image_classification_data(DataArguments(train_dir=str(tmp_path / "train"), on_bad_image="fail"))


def test_truncated_png_is_named(tmp_path):
    make_image_folder(tmp_path / "train", MIXED[:2], truncated=["cut.png"])
    with pytest.raises(UserInputError, match="cut.png"):
        load_image_classification_data(DataArguments(train_dir=str(tmp_path / "train"), on_bad_image="fail"))


def test_corrupt_image_is_left_out_of_its_batch_by_default(tmp_path):
    make_image_folder(tmp_path / "train", MIXED[:2], corrupt=["broken.jpg"])
    args = DataArguments(train_dir=str(tmp_path / "train"), train_val_split=0.5, random_resized_crop=False)
    data = load_image_classification_data(args, seed=0)
    rows = [split for split in data.splits.values()]
    splits = attach_transforms(data, 8, [0.5] * 3, [0.5] * 3, args)
    everything = [splits[name][i] for name in splits for i in range(len(splits[name]))]
    batch = collate_image_batch(everything)
    assert batch["pixel_values"].shape[0] == sum(len(r) for r in rows) - 1
    assert len(batch["bad_samples"]) == 1 and "broken.jpg" in batch["bad_samples"][0]["sample"]


def test_collate_bookkeeping_drops_bad_rows_and_keeps_indices():
    examples = [
        {"pixel_values": 1, "labels": 0, "bad_image": None, "sample_index": 5},
        {
            "pixel_values": None,
            "labels": 1,
            "bad_image": {"sample": "(in memory)", "reason": "OSError: x"},
            "sample_index": 9,
        },
        {"pixel_values": 2, "labels": 0, "bad_image": None, "sample_index": 7},
    ]
    good, extra = drop_bad_examples(examples)
    assert [e["sample_index"] for e in good] == [5, 7]
    assert extra["sample_index"].tolist() == [5, 7]
    assert extra["bad_samples"] == [{"sample": "row 9", "reason": "OSError: x"}]


def test_16bit_grayscale_is_scaled_to_8bit_not_clipped():
    buffer = io.BytesIO()
    Image.fromarray(GRAY16).save(buffer, format="PNG")
    image = decode_image({"bytes": buffer.getvalue(), "path": None})
    assert image.mode == "I;16"  # as PIL opens a 16-bit PNG
    assert np.array_equal(np.asarray(to_gray(image)), GRAY16_AS_8BIT)
    rgb = np.asarray(to_rgb(image))
    assert all(np.array_equal(rgb[..., c], GRAY16_AS_8BIT) for c in range(3))
    assert np.asarray(image.convert("L")).max() == 255 and np.asarray(image.convert("L"))[0, 0] == 100  # PIL clips


def test_raw_rows_become_uint8_tensors_and_a_wrong_length_is_named():
    rgb = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)
    pixels, reason = decode_raw(rgb.tobytes(), (4, 5, 3))
    assert reason is None and pixels.shape == (3, 4, 5) and torch.equal(pixels, torch.from_numpy(rgb).permute(2, 0, 1))
    gray = np.arange(20, dtype=np.uint8).reshape(4, 5)
    pixels, _ = decode_raw(gray.tobytes(), (4, 5, 1))
    assert pixels.shape == (3, 4, 5) and all(torch.equal(pixels[c], torch.from_numpy(gray)) for c in range(3))
    pixels, reason = decode_raw(b"\x00" * 7, (4, 5, 1))
    assert pixels is None and "7 bytes, expected 4x5x1 = 20" in reason
