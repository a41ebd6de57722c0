"""Decoding stored images without letting one bad file fail a batch: try_decode, the --on_bad_image fail pre-scan
naming the file, and the collate bookkeeping that drops bad rows."""

import io

import numpy as np
import pytest
from PIL import Image

from hf_vit_scaling import (
    DataArguments,
    UserInputError,
    attach_transforms,
    collate_image_batch,
    load_image_classification_data,
)
from hf_vit_scaling.data import drop_bad_examples, try_decode_image
from tests.helpers import MIXED, make_image_folder


def _png_bytes() -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.arange(64, dtype=np.uint8).reshape(8, 8)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_decoding_names_truncated_and_garbage_files():
    good = _png_bytes()
    image, reason = try_decode_image({"bytes": good, "path": None})
    assert reason is None and image.size == (8, 8)
    assert try_decode_image({"bytes": good[:40], "path": "cut.png"})[0] is None
    assert "UnidentifiedImageError" in try_decode_image({"bytes": b"not an image", "path": None})[1]


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
        {"pixel_values": None, "labels": 1, "bad_image": {"sample": "(in memory)", "reason": "OSError: x"},
         "sample_index": 9},
        {"pixel_values": 2, "labels": 0, "bad_image": None, "sample_index": 7},
    ]
    good, extra = drop_bad_examples(examples)
    assert [e["sample_index"] for e in good] == [5, 7]
    assert extra["sample_index"].tolist() == [5, 7]
    assert extra["bad_samples"] == [{"sample": "row 9", "reason": "OSError: x"}]
