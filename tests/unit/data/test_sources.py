"""Where the images come from: the built-in digits, image folders, datasets saved with `save_to_disk` or named on
the Hub; image and label column detection; --max_train_samples / --max_eval_samples."""

import pytest
import torch
from datasets import ClassLabel, Value

from hf_vit_scaling.arguments.data import DataArguments
from hf_vit_scaling.data.decoding import stack_batch as collate_image_batch
from hf_vit_scaling.data.host_transforms import attach_transforms
from hf_vit_scaling.data.loading import load_image_classification_data
from hf_vit_scaling.errors import UserInputError
from tests.helpers.builders import MIXED, make_image_folder, make_saved_dataset


def test_builtin_digits_is_real_and_split():
    data = load_image_classification_data(DataArguments(), seed=0)
    assert data.source == "sklearn-digits"
    assert data.label_names == [str(i) for i in range(10)]
    n_train, n_val = len(data.splits["train"]), len(data.splits["validation"])
    assert n_train + n_val == 1797 and n_val == pytest.approx(0.15 * 1797, abs=1)
    labels = data.splits["validation"]["label"]
    assert set(labels) == set(range(10))  # stratified: every class held out


@pytest.mark.parametrize("file_found", [True, False], ids=["csv-read-directly", "load_digits-fallback"])
def test_builtin_digits_are_scikit_learns_without_importing_it(monkeypatch, file_found):
    """The built-in set reads scikit-learn's bundled CSV itself (start-up without `import sklearn.datasets`), and
    equals `load_digits` pixel for pixel; if the file is not where it was, `load_digits` is used."""
    import importlib.util
    import subprocess
    import sys

    import numpy as np
    from sklearn.datasets import load_digits

    from hf_vit_scaling.data import sources

    if not file_found:
        monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    images, labels = sources.digits_arrays()
    reference = load_digits()
    assert np.array_equal(images, reference.images) and np.array_equal(labels, reference.target)
    if file_found:  # a fresh process: loading the built-in set imports no scikit-learn module
        code = (
            "import sys; from hf_vit_scaling.data.sources import builtin_digits; builtin_digits(); "
            "print(sorted(m for m in sys.modules if m.startswith('sklearn')))"
        )
        loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        assert loaded == "[]\n", loaded


def test_image_folder_mixed_modes_and_sizes_become_model_sized_rgb(tmp_path):
    make_image_folder(tmp_path / "train", MIXED)
    args = DataArguments(train_dir=str(tmp_path / "train"), train_val_split=0.25)
    data = load_image_classification_data(args, seed=0)
    assert data.label_names == ["cat", "dog"]
    assert len(data.splits["train"]) + len(data.splits["validation"]) == 12
    splits = attach_transforms(data, 24, [0.5] * 3, [0.5] * 3, args)
    batch = collate_image_batch([splits["train"][i] for i in range(len(splits["train"]))])
    assert batch["pixel_values"].shape == (len(splits["train"]), 3, 24, 24)
    assert batch["pixel_values"].dtype == torch.float32 and batch["labels"].dtype == torch.long
    assert batch["pixel_values"].min() >= -1.0 - 1e-5 and batch["pixel_values"].max() <= 1.0 + 1e-5


def test_separate_validation_folder(tmp_path):
    make_image_folder(tmp_path / "train", MIXED[:3])
    make_image_folder(tmp_path / "val", MIXED[3:])
    args = DataArguments(train_dir=str(tmp_path / "train"), validation_dir=str(tmp_path / "val"))
    data = load_image_classification_data(args)
    assert len(data.splits["train"]) == 6 and len(data.splits["validation"]) == 6


def test_folder_without_images(tmp_path):
    make_image_folder(tmp_path / "train", classes=("cat",), empty=True)
    with pytest.raises(UserInputError, match="holds no images"):
        load_image_classification_data(DataArguments(train_dir=str(tmp_path / "train")))


def _cifar_style(path, label_feature, labels):
    """CIFAR-100's column names ("img", "fine_label") and a "test" split of 2 rows."""
    return make_saved_dataset(path, labels, label_feature, image_column="img", label_column="fine_label", test_rows=2)


def test_saved_to_disk_cifar_style_columns_are_detected(tmp_path):
    path = _cifar_style(tmp_path / "ds", ClassLabel(names=["a", "b", "c"]), [0, 1, 2, 0, 1, 2])
    data = load_image_classification_data(DataArguments(dataset_name=str(path)))
    assert (data.image_column, data.label_column) == ("img", "fine_label")
    assert data.label_names == ["a", "b", "c"]
    assert len(data.splits["validation"]) == 2  # the "test" split is used for evaluation


def test_integer_labels_without_names(tmp_path):
    path = _cifar_style(tmp_path / "ds", Value("int64"), [0, 3, 1, 3, 2, 0])
    data = load_image_classification_data(DataArguments(dataset_name=str(path)))
    assert data.label_names == ["0", "1", "2", "3"]


def test_string_label_column_is_rejected(tmp_path):
    path = _cifar_style(tmp_path / "ds", Value("string"), ["x", "y", "x", "y", "x", "y"])
    with pytest.raises(UserInputError, match="not an integer or ClassLabel"):
        load_image_classification_data(DataArguments(dataset_name=str(path)))


def test_unknown_dataset_name_fails_clearly():
    with pytest.raises(UserInputError, match="--dataset_name 'no-such-org/no-such-dataset'"):
        load_image_classification_data(DataArguments(dataset_name="no-such-org/no-such-dataset"))


def test_max_samples_limit_both_splits():
    data = load_image_classification_data(DataArguments(max_train_samples=50, max_eval_samples=20), seed=1)
    assert len(data.splits["train"]) == 50 and len(data.splits["validation"]) == 20


def test_train_selection_records_the_rows_a_seed_draws(tmp_path):
    """Which training rows a run used: a subset drawn by --seed records the seed (two seeds draw different rows), a
    folder with its own validation split and no subset records none, as every seed reads the same rows."""
    subset = {seed: load_image_classification_data(DataArguments(max_train_samples=50), seed=seed) for seed in (1, 2)}
    for seed, data in subset.items():
        assert data.train_selection == {"source": "sklearn-digits", "rows": 50, "of": 1797, "seed": seed}
    assert subset[1].splits["train"]["label"] != subset[2].splits["train"]["label"]  # the seed drew other rows
    whole = load_image_classification_data(DataArguments(), seed=3)  # digits store no validation split: drawn
    assert whole.train_selection["seed"] == 3 and whole.train_selection["rows"] < 1797
    train, val = make_image_folder(tmp_path / "train", MIXED[:3]), make_image_folder(tmp_path / "val", MIXED[3:])
    folders = load_image_classification_data(DataArguments(train_dir=str(train), validation_dir=str(val)), seed=4)
    assert folders.train_selection == {"source": str(train), "rows": 6, "of": 6, "seed": None}
