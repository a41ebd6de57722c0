"""Tests `medical.splits`: group-aware stratified splits, the split file and split folders."""

import os
from collections import Counter

import numpy as np
import pytest
from PIL import Image

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.medical.splits import (
    SplitRecord,
    class_balance,
    read_split_file,
    split_folder_path,
    split_with_groups,
    write_split_file,
    write_split_folders,
)
from tests.helpers.builders import scan


def test_split_keeps_groups_whole_is_stratified_and_reproducible():
    rng = np.random.default_rng(0)
    labels, groups = [], []
    for g in range(300):  # groups of 1-5 images, 70% of them label 0
        size = int(rng.integers(1, 6))
        labels += [int(rng.random() < 0.3)] * size
        groups += [g] * size
    splits = split_with_groups(labels, groups, (0.7, 0.15, 0.15), seed=1)
    assert splits == split_with_groups(labels, groups, (0.7, 0.15, 0.15), seed=1)
    assert splits != split_with_groups(labels, groups, (0.7, 0.15, 0.15), seed=2)
    split_of_group = {}
    for g, s in zip(groups, splits):
        assert split_of_group.setdefault(g, s) == s
    for label in (0, 1):
        counts = Counter(s for s, y in zip(splits, labels) if y == label)
        total = sum(counts.values())
        for split, fraction in zip(("train", "validation", "test"), (0.7, 0.15, 0.15)):
            assert abs(counts[split] - fraction * total) <= 5  # within one group (at most 5 images)


def test_split_with_a_zero_fraction_and_bad_fractions():
    assert set(split_with_groups([0, 1] * 10, fractions=(0.8, 0.2, 0.0))) == {"train", "validation"}
    with pytest.raises(UserInputError, match="summing to 1"):
        split_with_groups([0, 1], fractions=(0.8, 0.3, 0.0))


def test_split_file_round_trips_and_refuses_leaks(tmp_path):
    records = [
        SplitRecord("yes/a.jpg", "yes", "train", "g0"),
        SplitRecord("no/b, c.jpg", "no", "test", "g1"),
        SplitRecord("yes/d.png", "yes", "train", "g0"),
    ]
    path = write_split_file(str(tmp_path / "split.csv"), records)
    assert read_split_file(path) == records
    assert open(path, encoding="utf-8").readline().strip() == "path,label,split,group"
    write_split_file(path, [*records, SplitRecord("no/e.jpg", "no", "validation", "g0")])
    with pytest.raises(UserInputError, match="group 'g0' is in both train and validation"):
        read_split_file(path)
    (tmp_path / "other.csv").write_text("file,label\nx,y\n")
    with pytest.raises(UserInputError, match="not path,label,split,group"):
        read_split_file(str(tmp_path / "other.csv"))


def test_class_balance_per_split():
    balance = class_balance(["no", "yes", "no", "no"], ["train", "train", "test", "train"])
    assert balance == {"train": {"no": 2, "yes": 1}, "test": {"no": 1, "yes": 0}}


@pytest.mark.parametrize("resize", [None, 24])
def test_split_folders_are_image_folders(tmp_path, resize):
    source = tmp_path / "images"
    (source / "yes").mkdir(parents=True)
    scan(5, 40).save(source / "yes" / "a.jpg")
    records = [SplitRecord("yes/a.jpg", "yes", "test", "g7")]
    assert write_split_folders(records, str(source), str(tmp_path / "out"), resize) == {"test": 1}
    target = split_folder_path(str(tmp_path / "out"), records[0], resize)
    assert target.endswith(os.path.join("test", "yes", "g7-a.png" if resize else "g7-a.jpg"))
    assert Image.open(target).size == ((24, 24) if resize else (40, 40))
    assert os.path.islink(target) == (resize is None)
