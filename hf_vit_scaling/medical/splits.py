"""Grouped, stratified splits that keep every duplicate group (or patient) on one side, the split file
(path, label, split, group) that records them, class balance, and folders written from a split."""

import csv
import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image

from hf_vit_scaling.data.decoding import decode_image, to_rgb
from hf_vit_scaling.errors import UserInputError

SPLIT_NAMES = ("train", "validation", "test")


SPLIT_FILE_COLUMNS = ("path", "label", "split", "group")


def check_fractions(fractions: Sequence[float]) -> tuple[float, ...]:
    if len(fractions) != len(SPLIT_NAMES) or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
        raise UserInputError(
            f"split fractions {tuple(fractions)} must be {len(SPLIT_NAMES)} non-negative numbers "
            f"({'/'.join(SPLIT_NAMES)}) summing to 1. Fix: e.g. 0.7 0.15 0.15."
        )
    return tuple(float(f) for f in fractions)


def split_with_groups(
    labels: Sequence, groups: Sequence | None = None, fractions: Sequence[float] = (0.7, 0.15, 0.15), seed: int = 0
) -> list[str]:
    """Split name per image, stratified by label, every group whole in one split.

    Each group counts toward its most frequent label (ties: the smallest label). Within a label, groups go largest
    first (ties in a seeded random order) to the split furthest below its target (fraction x that label's images),
    so fractions hold to within about one group per label and split; a split with fraction 0 gets nothing.
    The same labels, groups, fractions and seed always give the same split.
    """
    fractions = check_fractions(fractions)
    if groups is None:
        groups = range(len(labels))
    if len(groups) != len(labels):
        raise UserInputError(f"{len(groups)} group ids for {len(labels)} labels. Fix: give one group id per image.")
    members: dict = defaultdict(list)
    for i, g in enumerate(groups):
        members[g].append(i)
    by_label: dict = defaultdict(list)
    for g, idx in members.items():
        counts = Counter(labels[i] for i in idx)
        top = max(counts.values())
        by_label[min((lab for lab, c in counts.items() if c == top), key=str)].append(g)
    rng = np.random.default_rng(seed)
    usable = [s for s, f in enumerate(fractions) if f > 0]
    assignment: list[str] = [""] * len(labels)
    for label in sorted(by_label, key=str):
        label_groups = by_label[label]
        order = sorted(rng.permutation(len(label_groups)).tolist(), key=lambda k: -len(members[label_groups[k]]))
        total = sum(len(members[g]) for g in label_groups)
        filled = [0] * len(SPLIT_NAMES)
        for k in order:
            g = label_groups[k]
            s = max(usable, key=lambda s: fractions[s] * total - filled[s])  # first of equal deficits
            filled[s] += len(members[g])
            for i in members[g]:
                assignment[i] = SPLIT_NAMES[s]
    return assignment


def class_balance(labels: Sequence, splits: Sequence[str]) -> dict[str, dict[str, int]]:
    """{split: {label: images}} in SPLIT_NAMES order, labels sorted; every label appears in every split."""
    names = sorted({str(label) for label in labels})
    balance = {s: dict.fromkeys(names, 0) for s in SPLIT_NAMES if s in set(splits)}
    for label, split in zip(labels, splits):
        balance[split][str(label)] += 1
    return balance


def format_class_balance(balance: dict[str, dict[str, int]]) -> str:
    """A fixed-width table: one row per split, a column per label, then the total and the first label's share."""
    names = list(next(iter(balance.values()), {}))
    width = max([13, *(len(n) + 2 for n in names)])
    lines = ["split".ljust(12) + "".join(n.rjust(width) for n in names) + "total".rjust(8)]
    for split, counts in balance.items():
        total = sum(counts.values())
        cells = "".join(f"{c} ({c / max(total, 1):.0%})".rjust(width) for c in counts.values())
        lines.append(split.ljust(12) + cells + str(total).rjust(8))
    return "\n".join(lines)


@dataclass(frozen=True)
class SplitRecord:
    """One image of a split file: its path relative to the data root, label name, split name and group id."""

    path: str
    label: str
    split: str
    group: str


def write_split_file(path: str, records: Iterable[SplitRecord]) -> str:
    """CSV with the header path,label,split,group; written to a temporary name first, so a reader never sees half."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(SPLIT_FILE_COLUMNS)
        for r in records:
            writer.writerow([r.path, r.label, r.split, r.group])
    os.replace(tmp, path)
    return path


def read_split_file(path: str) -> list[SplitRecord]:
    """The records of a split file, checked: the header, known split names, no path twice, no group in two splits."""
    if not os.path.isfile(path):
        raise UserInputError(f"split file {path!r} does not exist. Fix: pass the CSV that the prepare step wrote.")
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        header = tuple(next(reader, ()))
        if header != SPLIT_FILE_COLUMNS:
            raise UserInputError(
                f"split file {path!r} starts with {','.join(header) or 'nothing'}, "
                f"not {','.join(SPLIT_FILE_COLUMNS)}. "
                "Fix: pass a split file written by hf_vit_scaling.medical.duplicates.write_split_file."
            )
        records = [SplitRecord(*row) for row in reader if row]
    check_split_records(records, path)
    return records


def check_split_records(records: Sequence[SplitRecord], where: str = "split") -> None:
    """Refuse unknown split names, a path listed twice, and a group (duplicates or one patient) in two splits."""
    seen: set[str] = set()
    split_of_group: dict[str, str] = {}
    for r in records:
        if r.split not in SPLIT_NAMES:
            raise UserInputError(
                f"{where}: {r.path!r} has split {r.split!r}. Fix: use one of {', '.join(SPLIT_NAMES)}."
            )
        if r.path in seen:
            raise UserInputError(f"{where}: {r.path!r} is listed twice. Fix: list every image once.")
        seen.add(r.path)
        other = split_of_group.setdefault(r.group, r.split)
        if other != r.split:
            raise UserInputError(
                f"{where}: group {r.group!r} is in both {other} and {r.split} ({r.path!r}): duplicates or one "
                "patient's images would leak across splits. Fix: put every image of a group in one split."
            )


def split_folder_path(out_dir: str, record: SplitRecord, resize: int | None = None) -> str:
    """Where `write_split_folders` puts a record's image: out_dir/<split>/<label>/<group>-<file name> (one folder per
    label, so the group prefix keeps equal file names from different source folders apart; .png when resized)."""
    name = os.path.basename(record.path)
    if resize:
        name = os.path.splitext(name)[0] + ".png"
    return os.path.join(out_dir, record.split, record.label, f"{record.group}-{name}")


def write_split_folders(
    records: Iterable[SplitRecord], source_root: str, out_dir: str, resize: int | None = None
) -> dict[str, int]:
    """`out_dir/<split>/<label>/` image folders (datasets' imagefolder layout) from split records whose paths are
    relative to `source_root`: symlinks to the originals, or with `resize` square RGB PNGs of that many pixels (one
    size for every image, so the recipe's batched device input path applies; the recipe resizes to a square anyway).
    Files already there are kept, so an interrupted run continues. Returns {split: images}."""
    written: Counter = Counter()
    for r in records:
        source, target = os.path.join(source_root, r.path), split_folder_path(out_dir, r, resize)
        written[r.split] += 1
        if os.path.lexists(target):
            continue
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if resize:
            image = to_rgb(decode_image(source)).resize((resize, resize), Image.Resampling.BICUBIC, reducing_gap=2.0)
            image.save(target + ".tmp", format="PNG")
            os.replace(target + ".tmp", target)
        else:
            os.symlink(os.path.relpath(os.path.abspath(source), os.path.dirname(os.path.abspath(target))), target)
    return dict(written)
