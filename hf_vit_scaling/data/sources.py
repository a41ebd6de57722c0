"""Where images come from: the built-in digits set, Hub datasets, image folders and save_to_disk folders.

Every source ends as an `ImageClassificationData`: a `DatasetDict` with "train" and "validation" splits, an image
column (kept encoded: see `decoding`) and an integer label column, checked before training starts.
`load_map_style_data` picks the source from the arguments; a further kind of source is one more branch in
`load_splits`. `loading.load_image_classification_data` calls it, or streams (`streaming`) with --streaming.
"""

import glob
import importlib.util
import os

import numpy as np
from datasets import ClassLabel, Dataset, DatasetDict, Features, load_dataset, load_from_disk
from datasets import Image as ImageFeature
from PIL import Image

from hf_vit_scaling.data.decoding import decode_images_lazily, refuse_bad_images
from hf_vit_scaling.data.shards import is_prepared, load_prepared, raw_shape, read_manifest
from hf_vit_scaling.data.types import (
    EVAL_SPLIT_CANDIDATES,
    ImageClassificationData,
    detect_image_column,
    detect_label_column,
)
from hf_vit_scaling.errors import UserInputError

BUILTIN_DATASET = "sklearn-digits"
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled digits as (images (1797, 8, 8) of 0..16, labels (1797,)), read from the CSV that
    `sklearn.datasets.load_digits` reads (`datasets/data/digits.csv.gz`: 64 pixels then the label per row) without
    importing scikit-learn: `import sklearn.datasets` costs about a second of start-up in every process that loads the
    built-in set (most launched tests). Falls back to `load_digits` if a scikit-learn release moves the file."""
    spec = importlib.util.find_spec("sklearn")  # locates the package without running it
    path = os.path.join(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz") if spec else ""
    if not os.path.isfile(path):
        from sklearn.datasets import load_digits

        digits = load_digits()
        return digits.images, digits.target
    rows = np.loadtxt(path, delimiter=",")
    return rows[:, :-1].reshape(-1, 8, 8), rows[:, -1].astype(int)


def builtin_digits() -> DatasetDict:
    """scikit-learn's bundled digits: 1,797 real 8x8 grayscale images of 0-9, no network needed."""
    pixels, labels = digits_arrays()
    # Pixel values are 0..16; x16 (capped at 255) gives ordinary 8-bit grayscale.
    images = [Image.fromarray(np.clip(img * 16, 0, 255).astype(np.uint8), mode="L") for img in pixels]
    features = Features({"image": ImageFeature(), "label": ClassLabel(names=[str(i) for i in range(10)])})
    return DatasetDict(train=Dataset.from_dict({"image": images, "label": labels.tolist()}, features=features))


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
    if is_prepared(name):
        return load_prepared(name, cache_dir)[0]
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


def load_splits(data_args, cache_dir: str | None = None) -> tuple[DatasetDict, str]:
    """(splits as stored, source name) for the source the arguments name: an image folder, a Hub id or
    save_to_disk folder, or the built-in digits."""
    if data_args.train_dir:
        return _load_image_folders(data_args.train_dir, data_args.validation_dir), data_args.train_dir
    if data_args.dataset_name:
        splits = _load_named_dataset(data_args.dataset_name, data_args.dataset_config_name, cache_dir)
        return splits, data_args.dataset_name
    return builtin_digits(), BUILTIN_DATASET


def load_map_style_data(data_args, seed: int = 42, cache_dir: str | None = None) -> ImageClassificationData:
    """Load, check and split a map-style source: an image folder, a Hub id or save_to_disk folder, prepared uint8
    shards, or the built-in digits."""
    splits, source = load_splits(data_args, cache_dir)
    if "train" not in splits:
        raise UserInputError(f"Dataset {source!r} has no 'train' split (splits: {', '.join(splits)}).")
    features = splits["train"].features
    image_column = detect_image_column(features, data_args.image_column_name)
    splits = decode_images_lazily(splits, image_column)
    prepared = raw_shape(read_manifest(source)) if is_prepared(data_args.dataset_name) else None
    if data_args.on_bad_image == "fail" and prepared is None:  # prepared images were decoded when prepared
        refuse_bad_images(splits, image_column)
    label_column = detect_label_column(features, data_args.label_column_name)
    stored_rows = len(splits["train"])
    splits = _ensure_eval_split(splits, data_args.train_val_split, seed, label_column)
    split_made = len(splits["train"]) < stored_rows  # no validation split stored: the seed drew one
    splits = DatasetDict(
        train=_subsample(splits["train"], data_args.max_train_samples, seed),
        validation=_subsample(splits["validation"], data_args.max_eval_samples, seed),
    )
    selection = train_selection(source, stored_rows, len(splits["train"]), seed, split_made)
    if len(splits["train"]) == 0 or len(splits["validation"]) == 0:
        raise UserInputError(f"Dataset {source!r} gives an empty train or validation split. Fix: add images.")
    return ImageClassificationData(
        splits,
        image_column,
        label_column,
        label_names_of(splits, label_column),
        source,
        data_args.on_bad_image,
        prepared,
        selection,
    )


def train_selection(source: str, stored_rows: int, train_rows: int, seed: int, split_made: bool) -> dict:
    """Which training rows a run used: the source's whole train split, or `train_rows` of its `stored_rows` drawn by
    `seed` (`--max_train_samples` shuffles with the seed, as the HF examples do, and a split drawn for validation
    depends on it too). Two runs saw the same rows exactly when these agree; a distillation teacher must have seen
    no row its student may not (`training.distillation.check_teacher_rows`)."""
    drawn = split_made or train_rows < stored_rows
    source = os.path.abspath(source) if os.path.exists(source) else source
    return {"source": source, "rows": train_rows, "of": stored_rows, "seed": seed if drawn else None}
