"""Decoding stored images so that one bad file costs one sample, not the run.

Images stay encoded in the dataset (`Image(decode=False)`) and are decoded here, per batch: a corrupt or truncated
file is left out of its batch and named (`--on_bad_image skip`), or stops the run naming it (`fail`). Every sample
carries its row (`sample_index`), so a batch can say which rows it holds: used to name skipped images and to trace
the data order of resumed runs (`--trace_samples`).
"""

import io
import os
import warnings

import numpy as np
import torch
from datasets import Dataset, DatasetDict
from datasets import Image as ImageFeature
from PIL import Image, UnidentifiedImageError

from hf_vit_scaling.data.sample_randomness import PerSampleRandomness, each_sample
from hf_vit_scaling.errors import UserInputError

_DECODE_ERRORS = (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError)


def decode_images_lazily(splits: DatasetDict, image_column: str) -> DatasetDict:
    """Keep the image column as encoded bytes/paths, so one corrupt file fails in our decoder (which can skip it)
    rather than inside datasets' row access (which would fail the whole batch)."""
    if not isinstance(splits["train"].features[image_column], ImageFeature):
        return splits
    return DatasetDict(
        {name: split.cast_column(image_column, ImageFeature(decode=False)) for name, split in splits.items()}
    )


def image_name(value, index: int | None = None) -> str:
    path = value.get("path") if isinstance(value, dict) else None
    return repr(path) if path else f"row {index}" if index is not None else "(in memory)"


def open_image_header(value) -> Image.Image:
    """A stored image (PIL image, a path, raw bytes, or datasets' undecoded {"bytes", "path"}) -> a PIL image whose
    header is read and whose pixels are not decoded yet: its size and mode are known for the price of the header, and
    a JPEG can still be decoded at reduced size (see `crop_decode`). `decode_image` loads the pixels."""
    if isinstance(value, (bytes, bytearray)):
        value = {"bytes": bytes(value)}
    elif isinstance(value, (str, os.PathLike)):
        value = {"path": os.fspath(value)}
    if not isinstance(value, dict):
        return value
    source = io.BytesIO(value["bytes"]) if value.get("bytes") else value.get("path")
    if source is None:
        raise ValueError("neither bytes nor a path")
    return Image.open(source)


def decode_image(value) -> Image.Image:
    """A stored image (anything `open_image_header` takes) -> a fully loaded PIL image.
    Raises one of _DECODE_ERRORS for a corrupt, truncated or unsupported file."""
    image = open_image_header(value)
    image.load()  # decode now: a truncated file fails here, not later inside a transform
    return image


def try_decode_image(value) -> tuple[Image.Image | None, str | None]:
    """(image, None), or (None, why) when the file cannot be decoded."""
    try:
        return decode_image(value), None
    except _DECODE_ERRORS as err:
        return None, f"{err.__class__.__name__}: {err}"


def find_bad_images(split: Dataset, image_column: str, first_only: bool = False) -> list[dict]:
    """Decode every image of a split (undecoded column): [{"sample", "reason"}] for those that fail."""
    bad, index = [], 0
    for batch in split.select_columns([image_column]).iter(batch_size=256):  # not the whole column in memory
        for value in batch[image_column]:
            _, reason = try_decode_image(value)
            if reason:
                bad.append({"sample": image_name(value, index), "reason": reason})
                if first_only:
                    return bad
            index += 1
    return bad


def bad_image_error(name: str, reason: str, split: str | None = None) -> UserInputError:
    where = f"{split} image" if split else "image"
    return UserInputError(
        f"--on_bad_image fail: {where} {name} cannot be decoded ({reason}). "
        "Fix: remove or replace that file, or pass --on_bad_image skip to train without it."
    )


def refuse_bad_images(splits: DatasetDict, image_column: str) -> None:
    """--on_bad_image fail: decode everything now, before the model is built; name the first bad image."""
    for name, split in splits.items():
        bad = find_bad_images(split, image_column, first_only=True)
        if bad:
            raise bad_image_error(bad[0]["sample"], bad[0]["reason"], split=name)


class SampleIndexDataset(torch.utils.data.Dataset):
    """A split whose items also carry `sample_index` (their row), so a batch can say which rows it holds: used to
    name skipped images and to trace the data order (`--trace_samples`). With `randomness`, each item's host
    transforms draw from that row's own stream (`sample_randomness`), the batch still read and transformed at once."""

    def __init__(self, dataset, randomness: PerSampleRandomness | None = None):
        self.dataset, self.randomness = dataset, randomness

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        if self.randomness is None:
            return {**self.dataset[index], "sample_index": index}
        with self.randomness.drawing_rows([index]):
            return {**self.dataset[index], "sample_index": index}

    def __getitems__(self, indices):  # the DataLoader's batched fetch: one read and one transform call per batch
        if self.randomness is None:
            items = self.dataset.__getitems__(indices)
        else:
            with self.randomness.drawing_rows(indices):  # each row's host draws from its own stream
                items = self.dataset.__getitems__(indices)
        return [{**item, "sample_index": i} for i, item in zip(indices, items)]


def with_sample_index(splits, seed: int | None = None) -> dict:
    """Every split with `sample_index`; with `seed`, the training split's host draws seeded per sample."""
    randomness = {"train": PerSampleRandomness(seed)} if seed is not None else {}
    return {name: SampleIndexDataset(split, randomness.get(name)) for name, split in splits.items()}


def pixels_or_note(convert, value, policy: str, name: str) -> tuple:
    """`convert(value)` (a `decode_then` function) -> (pixels, None), or (None, a bad-image note naming `name`) when
    the image cannot be decoded; under policy "fail" that raises `bad_image_error` instead."""
    pixels, reason = convert(value)
    if reason is None:
        return pixels, None
    if policy == "fail":
        raise bad_image_error(name, reason)
    return None, {"sample": name, "reason": reason}


def drop_bad_examples(examples: list[dict]) -> tuple[list[dict], dict]:
    """Split a batch's examples into the decodable ones and the bookkeeping fields the Trainer pops:
    `sample_index` (rows kept) and `bad_samples` (rows left out, with the reason)."""
    good = [e for e in examples if not e.get("bad_image")]
    extra = {}
    if good and "sample_index" in good[0]:
        extra["sample_index"] = torch.tensor([e["sample_index"] for e in good], dtype=torch.long)
    bad = []
    for e in examples:
        if e.get("bad_image"):
            note = dict(e["bad_image"])
            if note["sample"] == image_name(None) and "sample_index" in e:
                note["sample"] = f"row {e['sample_index']}"  # in-memory bytes: the row is the only name
            bad.append(note)
    if bad:
        extra["bad_samples"] = bad
    return good, extra


SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")


def to_8bit(image: Image.Image) -> Image.Image:
    """16-bit grayscale (PNG, TIFF; PIL mode I;16 or I) -> 8-bit L, scaled by 255/65535 (rounded). PIL's own
    convert("L") clips instead: every value above 255 becomes white. Mode I is taken to hold 16-bit values, as PIL
    opens 16-bit PNGs. Other modes pass through."""
    if image.mode not in SIXTEEN_BIT_MODES:
        return image
    values = np.asarray(image, dtype=np.float64)
    return Image.fromarray(np.clip(np.rint(values * (255 / 65535)), 0, 255).astype(np.uint8), mode="L")


def to_rgb(image: Image.Image) -> Image.Image:
    """Grayscale (8 or 16 bit), palette (with or without transparency), RGBA, CMYK... -> RGB."""
    if image.mode == "RGB":
        return image
    image = to_8bit(image)
    if image.mode == "P":
        image = image.convert("RGBA")
    return image.convert("RGB")


def to_gray(image: Image.Image) -> Image.Image:
    """Any mode -> 8-bit L (colour by ITU-R 601-2 luma, as PIL converts; 16-bit scaled, not clipped)."""
    image = to_8bit(image)
    if image.mode == "L":
        return image
    return to_rgb(image).convert("L")


def pil_to_uint8_tensor(image: Image.Image) -> torch.Tensor:
    """PIL image -> uint8 tensor (3, H, W); a uint8 tensor (a prepared shard's image) passes through."""
    if isinstance(image, torch.Tensor):
        return image
    array = np.asarray(to_rgb(image), dtype=np.uint8)
    return torch.from_numpy(array.copy()).permute(2, 0, 1)


def decode_raw(value, shape: tuple[int, int, int]) -> tuple[torch.Tensor | None, str | None]:
    """A prepared shard's image (raw uint8 bytes, row-major H x W x C, C = 3 or 1: see `shards`) -> (uint8 (3, H, W)
    tensor, None); grayscale is repeated to 3 channels. (None, why) when the byte count does not match the shape."""
    height, width, channels = shape
    if len(value) != height * width * channels:
        expected = height * width * channels
        return None, f"ValueError: {len(value)} bytes, expected {height}x{width}x{channels} = {expected}"
    with warnings.catch_warnings():  # read-only bytes: torch warns, but the tensor is only read (stacked)
        warnings.simplefilter("ignore", UserWarning)
        pixels = torch.frombuffer(value, dtype=torch.uint8).view(height, width, channels).permute(2, 0, 1)
    return (pixels.expand(3, height, width) if channels == 1 else pixels), None


def decode_then(convert, raw_shape: tuple[int, int, int] | None = None):
    """`convert` (applied to a decoded PIL image) -> a function of a stored image returning (convert(image), None),
    or (None, why) when the image cannot be decoded: what `set_pixel_transforms`' `to_pixels` returns.
    raw_shape (H, W, C): the stored images are prepared shards' raw bytes (`decode_raw`) and `convert` gets a uint8
    (3, H, W) tensor instead of a PIL image."""

    def apply(value):
        image, reason = decode_raw(value, raw_shape) if raw_shape else try_decode_image(value)
        return (None, reason) if reason else (convert(image), None)

    return apply


def set_pixel_transforms(data, to_pixels) -> DatasetDict:
    """Set on-the-fly transforms producing `pixel_values` and `labels` on both splits (needs
    remove_unused_columns=False). `to_pixels(train)` returns the function applied to each stored image of that
    split: value -> (pixels, None), or (None, why) when it cannot be decoded (`decode_then` builds one from a
    function of a decoded PIL image). An image that cannot be decoded gives `pixel_values` None and a `bad_image`
    note (see `stack_batch`), or stops the run naming it under --on_bad_image fail."""

    def make(train: bool):
        convert = to_pixels(train)

        def apply(batch):
            pixels, notes = [], []
            for value in each_sample(batch[data.image_column]):  # a training row's own host draws
                out, note = pixels_or_note(convert, value, data.on_bad_image, image_name(value))
                pixels.append(out)
                notes.append(note)
            return {"pixel_values": pixels, "labels": batch[data.label_column], "bad_image": notes}

        return apply

    data.splits["train"].set_transform(make(train=True))
    data.splits["validation"].set_transform(make(train=False))
    return data.splits


def stack_batch(examples: list[dict], stack=torch.stack) -> dict:
    """Stack a batch's `pixel_values` (with `stack`) and `labels`; images that could not be decoded are left out (and
    listed under `bad_samples`), the rows kept are listed under `sample_index`."""
    good, extra = drop_bad_examples(examples)
    return {
        "pixel_values": stack([e["pixel_values"] for e in good]),
        "labels": torch.tensor([e["labels"] for e in good], dtype=torch.long),
        **extra,
    }


# The per-sample path's collate (the recipes' name for it) is the plain stack.
collate_image_batch = stack_batch
