#!/usr/bin/env python
"""Fashion-MNIST (Xiao et al. 2017) as a `datasets` save_to_disk folder that recipes/train_vit.py reads offline.

    apt-get install -y dataset-fashion-mnist      # Debian/Ubuntu: the four IDX files, no network at training time
    python recipes/fashion_mnist/prepare.py --output_dir data/fashion_mnist
    python recipes/train_vit.py recipes/fashion_mnist/config_light_5k.yaml

The folder holds a `DatasetDict` with "train" (60,000 images) and "test" (10,000; the recipe evaluates on it), an
`image` column (28 x 28 grayscale PIL images, mode L) and a `label` ClassLabel with the ten class names as the Hub
copy spells them. With network access the Hub copy is the same data: --dataset_name zalando-datasets/fashion_mnist.

IDX format (LeCun et al.'s MNIST files): big-endian int32 magic (0x00000803 = 2051 for images, 0x00000801 = 2049
for labels), then the dimensions (count, and rows x cols for images), then the uint8 values row by row.
"""

import gzip
import os
import shutil
import sys

import numpy as np
from datasets import ClassLabel, Dataset, DatasetDict, Features
from datasets import Image as ImageFeature
from PIL import Image

from hf_vit_scaling.arguments.field_checks import require_writable_folder
from hf_vit_scaling.arguments.parser import ScriptParser
from hf_vit_scaling.errors import UserInputError

DEBIAN_FOLDER = "/usr/share/datasets/fashion-mnist"
# The Hub dataset's ClassLabel names (zalando-datasets/fashion_mnist), in label order 0-9.
CLASS_NAMES = [
    "T - shirt / top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]
SPLITS = {"train": ("train", 60_000), "test": ("t10k", 10_000)}
IMAGES_MAGIC, LABELS_MAGIC = 2051, 2049


def read_idx(path: str, magic: int) -> np.ndarray:
    """An IDX file (gzipped or not) -> uint8 array of shape (count,) or (count, rows, cols)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = 3 if magic == IMAGES_MAGIC else 1
    header = 4 * (1 + ndim)
    if len(data) < header or int.from_bytes(data[:4], "big") != magic:
        raise UserInputError(
            f"{path} is not an IDX {'image' if ndim == 3 else 'label'} file (magic number "
            f"{int.from_bytes(data[:4], 'big') if len(data) >= 4 else 'missing'}, expected {magic}). "
            "Fix: reinstall dataset-fashion-mnist or point --source at the original files."
        )
    shape = tuple(int.from_bytes(data[4 * (i + 1) : 4 * (i + 2)], "big") for i in range(ndim))
    values = np.frombuffer(data, dtype=np.uint8, offset=header)
    if values.size != int(np.prod(shape)):
        raise UserInputError(
            f"{path} is truncated: the header says {shape}, the file holds {values.size} values. "
            "Fix: reinstall dataset-fashion-mnist or download the file again."
        )
    return values.reshape(shape)


def find_file(source: str, stem: str) -> str:
    for name in (f"{stem}.gz", stem):
        path = os.path.join(source, name)
        if os.path.isfile(path):
            return path
    raise UserInputError(
        f"{os.path.join(source, stem)}[.gz] not found. Fix: apt-get install -y dataset-fashion-mnist "
        f"(files in {DEBIAN_FOLDER}), or pass --source with the four IDX files."
    )


def load_split(source: str, prefix: str, expected: int | None) -> Dataset:
    images = read_idx(find_file(source, f"{prefix}-images-idx3-ubyte"), IMAGES_MAGIC)
    labels = read_idx(find_file(source, f"{prefix}-labels-idx1-ubyte"), LABELS_MAGIC)
    if len(images) != len(labels):
        raise UserInputError(
            f"{source}: {len(images)} {prefix} images but {len(labels)} labels. Fix: reinstall dataset-fashion-mnist."
        )
    if expected is not None and len(images) != expected:
        raise UserInputError(
            f"{source}: {len(images)} {prefix} images, Fashion-MNIST has {expected}. "
            "Fix: point --source at the Fashion-MNIST files (or pass --no_size_check)."
        )
    if labels.size and labels.max() >= len(CLASS_NAMES):
        raise UserInputError(f"{source}: label {labels.max()} in {prefix}; Fashion-MNIST has 10 classes (0-9).")
    features = Features({"image": ImageFeature(), "label": ClassLabel(names=CLASS_NAMES)})
    return Dataset.from_dict(
        {"image": [Image.fromarray(image, mode="L") for image in images], "label": labels.astype(np.int64).tolist()},
        features=features,
    )


def main(argv=None) -> int:
    parser = ScriptParser("recipes/fashion_mnist/prepare.py", __doc__)
    parser.add_argument("--output_dir", required=True, help="Folder to write (datasets' save_to_disk layout).")
    parser.add_argument(
        "--source", default=DEBIAN_FOLDER, help=f"Folder with the IDX files (default {DEBIAN_FOLDER})."
    )
    parser.add_argument("--overwrite", action="store_true", help="Replace --output_dir if it exists.")
    parser.add_argument(
        "--no_size_check",
        action="store_true",
        help="Accept split sizes other than 60,000 / 10,000 (for tests on small files).",
    )
    try:
        args = parser.parse_args(argv)
        if os.path.exists(args.output_dir) and not args.overwrite:
            raise UserInputError(f"--output_dir {args.output_dir} exists. Fix: pass --overwrite, or another folder.")
        require_writable_folder("output_dir", args.output_dir)
        splits = DatasetDict(
            {
                name: load_split(args.source, prefix, None if args.no_size_check else size)
                for name, (prefix, size) in SPLITS.items()
            }
        )
    except UserInputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if os.path.exists(args.output_dir):
        shutil.rmtree(args.output_dir)
    splits.save_to_disk(args.output_dir)
    sizes = ", ".join(f"{name} {len(split):,}" for name, split in splits.items())
    print(
        f"Wrote {args.output_dir}: {sizes} images (28 x 28, mode L), 10 classes. "
        f"Train with: --dataset_name {args.output_dir}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
