"""Image-classification data: the built-in digits set, Hub datasets, image folders and save_to_disk folders.

Every source ends as a `DatasetDict` with "train" and "validation" splits, an image column and an integer label
column, checked before training starts. Transforms are plain torch (no torchvision dependency).
"""

import glob
import io
import math
import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from datasets import ClassLabel, Dataset, DatasetDict, Features, Value, load_dataset, load_from_disk
from datasets import Image as ImageFeature
from PIL import Image, UnidentifiedImageError

from .errors import UserInputError

BUILTIN_DATASET = "sklearn-digits"
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
IMAGE_COLUMN_CANDIDATES = ("image", "img", "images", "picture")
LABEL_COLUMN_CANDIDATES = ("label", "labels", "fine_label", "class", "target")
EVAL_SPLIT_CANDIDATES = ("validation", "valid", "val", "test")


@dataclass
class ImageClassificationData:
    """Splits plus what the rest of the recipe needs to know about them."""

    splits: DatasetDict
    image_column: str
    label_column: str
    label_names: list[str]
    source: str
    on_bad_image: str = "skip"  # skip: leave undecodable images out of their batch and count them; fail: stop


def builtin_digits() -> DatasetDict:
    """scikit-learn's bundled digits: 1,797 real 8x8 grayscale images of 0-9, no network needed."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    # Pixel values are 0..16; x16 (capped at 255) gives ordinary 8-bit grayscale.
    images = [Image.fromarray(np.clip(img * 16, 0, 255).astype(np.uint8), mode="L") for img in digits.images]
    features = Features({"image": ImageFeature(), "label": ClassLabel(names=[str(i) for i in range(10)])})
    return DatasetDict(train=Dataset.from_dict({"image": images, "label": digits.target.tolist()}, features=features))


def check_image_folder(folder: str, flag: str) -> None:
    """The folder holds at least one image file (each file is decoded later: see `find_bad_images`)."""
    files = [
        p for p in glob.glob(os.path.join(folder, "**", "*"), recursive=True) if p.lower().endswith(IMAGE_EXTENSIONS)
    ]
    if not files:
        raise UserInputError(
            f"{flag} {folder!r} holds no images ({', '.join(IMAGE_EXTENSIONS)}). "
            "Fix: point it at a folder with one sub-folder of images per class."
        )


def _load_image_folders(train_dir: str, validation_dir: str | None) -> DatasetDict:
    check_image_folder(train_dir, "--train_dir")
    data_files = {"train": os.path.join(train_dir, "**")}
    if validation_dir:
        check_image_folder(validation_dir, "--validation_dir")
        data_files["validation"] = os.path.join(validation_dir, "**")
    return load_dataset("imagefolder", data_files=data_files)


def _is_saved_dataset(path: str) -> bool:
    return os.path.isdir(path) and any(
        os.path.isfile(os.path.join(path, name)) for name in ("dataset_dict.json", "state.json")
    )


def _load_named_dataset(name: str, config_name: str | None, cache_dir: str | None) -> DatasetDict:
    if _is_saved_dataset(name):
        loaded = load_from_disk(name)
        return loaded if isinstance(loaded, DatasetDict) else DatasetDict(train=loaded)
    try:
        return load_dataset(name, config_name, cache_dir=cache_dir)
    except Exception as err:  # datasets raises many types here (not found, offline, bad config)
        raise UserInputError(
            f"--dataset_name {name!r} could not be loaded ({err.__class__.__name__}: {str(err).splitlines()[0]}). "
            "Fix: check the Hub id (e.g. uoft-cs/cifar10) and your network, or pass a save_to_disk folder, or "
            "--train_dir for an image folder."
        ) from err


def detect_image_column(features: Features, given: str | None) -> str:
    if given:
        if given not in features:
            raise UserInputError(
                f"--image_column_name {given!r} is not a column (columns: {', '.join(features)}). Fix: name one of them."
            )
        return given
    for name, feature in features.items():
        if isinstance(feature, ImageFeature):
            return name
    for name in IMAGE_COLUMN_CANDIDATES:
        if name in features:
            return name
    raise UserInputError(
        f"No image column found (columns: {', '.join(features)}). Fix: pass --image_column_name."
    )


def _is_integer_feature(feature) -> bool:
    return isinstance(feature, ClassLabel) or (isinstance(feature, Value) and feature.dtype.startswith(("int", "uint")))


def detect_label_column(features: Features, given: str | None) -> str:
    if given:
        if given not in features:
            raise UserInputError(
                f"--label_column_name {given!r} is not a column (columns: {', '.join(features)}). Fix: name one of them."
            )
        name = given
    else:
        names = [n for n in LABEL_COLUMN_CANDIDATES if n in features]
        names += [n for n, f in features.items() if isinstance(f, ClassLabel) and n not in names]
        if not names:
            raise UserInputError(f"No label column found (columns: {', '.join(features)}). Fix: pass --label_column_name.")
        name = names[0]
    if not _is_integer_feature(features[name]):
        raise UserInputError(
            f"Label column {name!r} has type {features[name]!r}, not an integer or ClassLabel. "
            "Fix: pass --label_column_name with an integer/class column, or cast it first "
            "(datasets: dataset.class_encode_column(name))."
        )
    return name


def label_names_of(splits: DatasetDict, label_column: str) -> list[str]:
    feature = splits["train"].features[label_column]
    if isinstance(feature, ClassLabel):
        return list(feature.names)
    values = set(splits["train"][label_column])
    if min(values) < 0:
        raise UserInputError(f"Label column {label_column!r} has negative labels. Fix: use labels 0..N-1.")
    return [str(i) for i in range(max(values) + 1)]


def _ensure_eval_split(splits: DatasetDict, train_val_split: float, seed: int, label_column: str) -> DatasetDict:
    for name in EVAL_SPLIT_CANDIDATES:
        if name in splits:
            return DatasetDict(train=splits["train"], validation=splits[name])
    stratify = label_column if isinstance(splits["train"].features[label_column], ClassLabel) else None
    parts = splits["train"].train_test_split(test_size=train_val_split, seed=seed, stratify_by_column=stratify)
    return DatasetDict(train=parts["train"], validation=parts["test"])


def _subsample(dataset: Dataset, limit: int | None, seed: int) -> Dataset:
    if limit is None or limit >= len(dataset):
        return dataset
    return dataset.shuffle(seed=seed).select(range(limit))


def load_image_classification_data(data_args, seed: int = 42, cache_dir: str | None = None) -> ImageClassificationData:
    """Load, check and split the data the arguments name."""
    if data_args.train_dir:
        splits, source = _load_image_folders(data_args.train_dir, data_args.validation_dir), data_args.train_dir
    elif data_args.dataset_name:
        splits = _load_named_dataset(data_args.dataset_name, data_args.dataset_config_name, cache_dir)
        source = data_args.dataset_name
    else:
        splits, source = builtin_digits(), BUILTIN_DATASET
    if "train" not in splits:
        raise UserInputError(f"Dataset {source!r} has no 'train' split (splits: {', '.join(splits)}).")
    features = splits["train"].features
    image_column = detect_image_column(features, data_args.image_column_name)
    splits = decode_images_lazily(splits, image_column)
    if data_args.on_bad_image == "fail":
        refuse_bad_images(splits, image_column)
    label_column = detect_label_column(features, data_args.label_column_name)
    splits = _ensure_eval_split(splits, data_args.train_val_split, seed, label_column)
    splits = DatasetDict(
        train=_subsample(splits["train"], data_args.max_train_samples, seed),
        validation=_subsample(splits["validation"], data_args.max_eval_samples, seed),
    )
    if len(splits["train"]) == 0 or len(splits["validation"]) == 0:
        raise UserInputError(f"Dataset {source!r} gives an empty train or validation split. Fix: add images.")
    return ImageClassificationData(
        splits, image_column, label_column, label_names_of(splits, label_column), source, data_args.on_bad_image
    )


# ---------------------------------------------------------------- decoding that survives a bad file

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


def decode_image(value) -> Image.Image:
    """A stored image (PIL image, or datasets' undecoded {"bytes", "path"}) -> a fully loaded PIL image.
    Raises one of _DECODE_ERRORS for a corrupt, truncated or unsupported file."""
    if not isinstance(value, dict):
        return value
    source = io.BytesIO(value["bytes"]) if value.get("bytes") else value.get("path")
    if source is None:
        raise ValueError("neither bytes nor a path")
    image = Image.open(source)
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
    name skipped images and to trace the data order (`--trace_samples`)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        return {**self.dataset[index], "sample_index": index}

    def __getitems__(self, indices):  # the DataLoader's batched fetch: one transform call per batch
        return [{**item, "sample_index": i} for i, item in zip(indices, self.dataset.__getitems__(indices))]


def with_sample_index(splits) -> dict:
    return {name: SampleIndexDataset(split) for name, split in splits.items()}


def decoded_or_marked(values, policy: str) -> tuple[list, list]:
    """Decode a batch of stored images. Returns (images with None for bad ones, bad-image notes or None).
    policy "fail": a bad image raises UserInputError naming it instead."""
    images, notes = [], []
    for value in values:
        image, reason = try_decode_image(value)
        if reason and policy == "fail":
            raise bad_image_error(image_name(value), reason)
        images.append(image)
        notes.append({"sample": image_name(value), "reason": reason} if reason else None)
    return images, notes


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


# ---------------------------------------------------------------- transforms (per-sample, torch only)


def to_rgb(image: Image.Image) -> Image.Image:
    """Grayscale, palette (with or without transparency), RGBA, CMYK... -> RGB."""
    if image.mode == "RGB":
        return image
    if image.mode == "P":
        image = image.convert("RGBA")
    return image.convert("RGB")


def pil_to_uint8_tensor(image: Image.Image) -> torch.Tensor:
    """PIL image -> uint8 tensor (3, H, W)."""
    array = np.asarray(to_rgb(image), dtype=np.uint8)
    return torch.from_numpy(array.copy()).permute(2, 0, 1)


def _uniform(low: float, high: float) -> float:
    return low + (high - low) * torch.rand(()).item()


def random_resized_crop_box(height: int, width: int, scale_min: float) -> tuple[int, int, int, int]:
    """(top, left, h, w) as torchvision's RandomResizedCrop samples it: area in [scale_min, 1], ratio in [3/4, 4/3].

    Uses torch's global RNG, which the Trainer seeds and each DataLoader worker re-seeds.
    """
    area = height * width
    for _ in range(10):
        target_area = area * _uniform(scale_min, 1.0)
        aspect = math.exp(_uniform(math.log(3 / 4), math.log(4 / 3)))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, ()).item())
            left = int(torch.randint(0, width - w + 1, ()).item())
            return top, left, h, w
    return 0, 0, height, width  # fallback: the whole image


class ImageTransform:
    """uint8/PIL image -> normalised float (3, S, S); training adds random resized crop and horizontal flip."""

    def __init__(self, size: int, mean, std, train: bool, random_resized_crop: bool = True,
                 crop_scale_min: float = 0.08, horizontal_flip: bool = True):
        self.size, self.train = size, train
        self.crop, self.crop_scale_min, self.flip = random_resized_crop, crop_scale_min, horizontal_flip
        self.mean = torch.tensor(mean, dtype=torch.float32).view(3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(3, 1, 1)

    def __call__(self, image) -> torch.Tensor:
        pixels = pil_to_uint8_tensor(image) if isinstance(image, Image.Image) else image
        if self.train and self.crop:
            top, left, h, w = random_resized_crop_box(pixels.shape[1], pixels.shape[2], self.crop_scale_min)
            pixels = pixels[:, top : top + h, left : left + w]
        x = pixels.unsqueeze(0).float() / 255.0
        if x.shape[-2:] != (self.size, self.size):
            # Antialiased bilinear, as PIL's resize in ViTImageProcessor.
            x = F.interpolate(x, size=(self.size, self.size), mode="bilinear", antialias=True, align_corners=False)
        x = x.squeeze(0)
        if self.train and self.flip and torch.rand(()).item() < 0.5:
            x = x.flip(-1)
        return (x - self.mean) / self.std


def attach_transforms(data: ImageClassificationData, size: int, mean, std, data_args) -> DatasetDict:
    """Set on-the-fly transforms producing `pixel_values` and `labels` (needs remove_unused_columns=False).
    An image that cannot be decoded gives `pixel_values` None and a `bad_image` note (see `collate_image_batch`)."""

    def make(train: bool):
        transform = ImageTransform(
            size, mean, std, train, data_args.random_resized_crop, data_args.crop_scale_min, data_args.horizontal_flip
        )

        def apply(batch):
            images, notes = decoded_or_marked(batch[data.image_column], data.on_bad_image)
            return {
                "pixel_values": [None if img is None else transform(img) for img in images],
                "labels": batch[data.label_column],
                "bad_image": notes,
            }

        return apply

    data.splits["train"].set_transform(make(train=True))
    data.splits["validation"].set_transform(make(train=False))
    return data.splits


def collate_image_batch(examples: list[dict]) -> dict:
    """Stack a batch; images that could not be decoded are left out (and listed under `bad_samples`)."""
    good, extra = drop_bad_examples(examples)
    return {
        "pixel_values": torch.stack([e["pixel_values"] for e in good]),
        "labels": torch.tensor([e["labels"] for e in good], dtype=torch.long),
        **extra,
    }
