"""What every data source produces, and the columns it is read by: a leaf module (no other data module imported),
so sources, streaming, the input paths and the recipe can all share it."""

from dataclasses import dataclass
from typing import ClassVar

from datasets import ClassLabel, DatasetDict, Features, Value
from datasets import Image as ImageFeature

from hf_vit_scaling.errors import UserInputError

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
    raw_shape: tuple[int, int, int] | None = None  # prepared shards: (H, W, C) of every image, stored as raw uint8
    train_selection: dict | None = None  # which training rows this run uses (`sources.train_selection`)

    streaming: ClassVar[bool] = False  # map-style: every split is random-access (`streaming.load.StreamingData`)

    def stored_images(self, limit: int) -> list:
        """The first `limit` stored (undecoded) images of the training split, then of the validation split."""
        values = []
        for split in ("train", "validation"):
            values += self.splits[split].select(range(min(limit, len(self.splits[split]))))[self.image_column]
        return values


def _given_column(features: Features, given: str, flag: str) -> str:
    if given not in features:
        raise UserInputError(
            f"{flag} {given!r} is not a column (columns: {', '.join(features)}). Fix: name one of them."
        )
    return given


def detect_image_column(features: Features, given: str | None) -> str:
    if given:
        return _given_column(features, given, "--image_column_name")
    for name, feature in features.items():
        if isinstance(feature, ImageFeature):
            return name
    for name in IMAGE_COLUMN_CANDIDATES:
        if name in features:
            return name
    raise UserInputError(f"No image column found (columns: {', '.join(features)}). Fix: pass --image_column_name.")


def _is_integer_feature(feature) -> bool:
    return isinstance(feature, ClassLabel) or (
        isinstance(feature, Value) and feature.dtype.startswith(("int", "uint"))
    )


def detect_label_column(features: Features, given: str | None) -> str:
    if given:
        name = _given_column(features, given, "--label_column_name")
    else:
        names = [n for n in LABEL_COLUMN_CANDIDATES if n in features]
        names += [n for n, f in features.items() if isinstance(f, ClassLabel) and n not in names]
        if not names:
            raise UserInputError(
                f"No label column found (columns: {', '.join(features)}). Fix: pass --label_column_name."
            )
        name = names[0]
    if not _is_integer_feature(features[name]):
        raise UserInputError(
            f"Label column {name!r} has type {features[name]!r}, not an integer or ClassLabel. "
            "Fix: pass --label_column_name with an integer/class column, or cast it first "
            "(datasets: dataset.class_encode_column(name))."
        )
    return name
