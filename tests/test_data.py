import numpy as np
import pytest
import torch
from datasets import ClassLabel, Dataset, DatasetDict, Features, Value
from datasets import Image as ImageFeature
from PIL import Image

from hf_vit_scaling import (
    DataArguments,
    ImageTransform,
    UserInputError,
    attach_transforms,
    collate_image_batch,
    load_image_classification_data,
)
from hf_vit_scaling.data import detect_image_column, detect_label_column, random_resized_crop_box


def make_image_folder(root, modes_and_sizes, classes=("cat", "dog")):
    """Class sub-folders holding images of mixed modes and sizes."""
    rng = np.random.default_rng(0)
    for cls in classes:
        (root / cls).mkdir(parents=True, exist_ok=True)
        for i, (mode, size) in enumerate(modes_and_sizes):
            array = rng.integers(0, 255, size=(size[1], size[0], 4 if mode == "RGBA" else 3), dtype=np.uint8)
            img = Image.fromarray(array, mode="RGBA" if mode == "RGBA" else "RGB")
            if mode == "L":
                img = img.convert("L")
            elif mode == "P":
                img = img.convert("P")
            img.save(root / cls / f"{i}.png")
    return root


MIXED = [("RGB", (20, 12)), ("L", (9, 9)), ("P", (31, 17)), ("RGBA", (16, 40)), ("RGB", (64, 64)), ("L", (5, 7))]


def test_builtin_digits_is_real_and_split():
    data = load_image_classification_data(DataArguments(), seed=0)
    assert data.source == "sklearn-digits"
    assert data.label_names == [str(i) for i in range(10)]
    n_train, n_val = len(data.splits["train"]), len(data.splits["validation"])
    assert n_train + n_val == 1797 and n_val == pytest.approx(0.15 * 1797, abs=1)
    labels = data.splits["validation"]["label"]
    assert set(labels) == set(range(10))  # stratified: every class held out


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


def test_corrupt_image_is_named(tmp_path):
    make_image_folder(tmp_path / "train", MIXED[:2])
    bad = tmp_path / "train" / "dog" / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 definitely not a jpeg")
    with pytest.raises(UserInputError, match="broken.jpg"):
        load_image_classification_data(DataArguments(train_dir=str(tmp_path / "train"), on_bad_image="fail"))


def test_truncated_png_is_named(tmp_path):
    make_image_folder(tmp_path / "train", MIXED[:2])
    good = tmp_path / "train" / "cat" / "0.png"
    (tmp_path / "train" / "cat" / "cut.png").write_bytes(good.read_bytes()[:60])
    with pytest.raises(UserInputError, match="cut.png"):
        load_image_classification_data(DataArguments(train_dir=str(tmp_path / "train"), on_bad_image="fail"))


def test_corrupt_image_is_left_out_of_its_batch_by_default(tmp_path):
    make_image_folder(tmp_path / "train", MIXED[:2])
    (tmp_path / "train" / "dog" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 definitely not a jpeg")
    args = DataArguments(train_dir=str(tmp_path / "train"), train_val_split=0.5, random_resized_crop=False)
    data = load_image_classification_data(args, seed=0)
    rows = [split for split in data.splits.values()]
    splits = attach_transforms(data, 8, [0.5] * 3, [0.5] * 3, args)
    everything = [splits[name][i] for name in splits for i in range(len(splits[name]))]
    batch = collate_image_batch(everything)
    assert batch["pixel_values"].shape[0] == sum(len(r) for r in rows) - 1
    assert len(batch["bad_samples"]) == 1 and "broken.jpg" in batch["bad_samples"][0]["sample"]


def test_folder_without_images(tmp_path):
    (tmp_path / "train" / "cat").mkdir(parents=True)
    (tmp_path / "train" / "cat" / "notes.txt").write_text("no images here")
    with pytest.raises(UserInputError, match="holds no images"):
        load_image_classification_data(DataArguments(train_dir=str(tmp_path / "train")))


def _saved_dataset(path, label_feature, labels, image_name="img"):
    images = [Image.fromarray(np.full((6, 6), 40 * i, dtype=np.uint8), mode="L") for i in range(len(labels))]
    features = Features({image_name: ImageFeature(), "fine_label": label_feature})
    ds = Dataset.from_dict({image_name: images, "fine_label": labels}, features=features)
    DatasetDict(train=ds, test=ds.select(range(2))).save_to_disk(str(path))
    return path


def test_saved_to_disk_cifar_style_columns_are_detected(tmp_path):
    path = _saved_dataset(tmp_path / "ds", ClassLabel(names=["a", "b", "c"]), [0, 1, 2, 0, 1, 2])
    data = load_image_classification_data(DataArguments(dataset_name=str(path)))
    assert (data.image_column, data.label_column) == ("img", "fine_label")
    assert data.label_names == ["a", "b", "c"]
    assert len(data.splits["validation"]) == 2  # the "test" split is used for evaluation


def test_integer_labels_without_names(tmp_path):
    path = _saved_dataset(tmp_path / "ds", Value("int64"), [0, 3, 1, 3, 2, 0])
    data = load_image_classification_data(DataArguments(dataset_name=str(path)))
    assert data.label_names == ["0", "1", "2", "3"]


def test_string_label_column_is_rejected(tmp_path):
    path = _saved_dataset(tmp_path / "ds", Value("string"), ["x", "y", "x", "y", "x", "y"])
    with pytest.raises(UserInputError, match="not an integer or ClassLabel"):
        load_image_classification_data(DataArguments(dataset_name=str(path)))


def test_unknown_column_names_are_rejected():
    features = Features({"img": ImageFeature(), "fine_label": ClassLabel(names=["a"]), "coarse_label": Value("int8")})
    assert detect_image_column(features, None) == "img"
    assert detect_label_column(features, None) == "fine_label"
    assert detect_label_column(features, "coarse_label") == "coarse_label"
    with pytest.raises(UserInputError, match="--image_column_name 'picture'"):
        detect_image_column(features, "picture")
    with pytest.raises(UserInputError, match="--label_column_name 'lbl'"):
        detect_label_column(features, "lbl")


def test_unknown_dataset_name_fails_clearly():
    with pytest.raises(UserInputError, match="--dataset_name 'no-such-org/no-such-dataset'"):
        load_image_classification_data(DataArguments(dataset_name="no-such-org/no-such-dataset"))


def test_max_samples_limit_both_splits():
    data = load_image_classification_data(DataArguments(max_train_samples=50, max_eval_samples=20), seed=1)
    assert len(data.splits["train"]) == 50 and len(data.splits["validation"]) == 20


def test_eval_transform_is_deterministic_and_train_augments():
    img = Image.fromarray(np.arange(64, dtype=np.uint8).reshape(8, 8) * 4, mode="L")
    eval_t = ImageTransform(16, [0.5] * 3, [0.5] * 3, train=False)
    assert torch.equal(eval_t(img), eval_t(img))
    train_t = ImageTransform(16, [0.5] * 3, [0.5] * 3, train=True, crop_scale_min=0.3, horizontal_flip=True)
    torch.manual_seed(0)
    outs = [train_t(img) for _ in range(8)]
    assert all(o.shape == (3, 16, 16) for o in outs)
    assert any(not torch.equal(outs[0], o) for o in outs[1:])
    no_aug = ImageTransform(16, [0.5] * 3, [0.5] * 3, train=True, random_resized_crop=False, horizontal_flip=False)
    assert torch.equal(no_aug(img), eval_t(img))


def test_random_resized_crop_box_stays_inside_and_respects_scale():
    torch.manual_seed(0)
    for _ in range(200):
        top, left, h, w = random_resized_crop_box(30, 40, 0.5)
        assert 0 <= top and top + h <= 30 and 0 <= left and left + w <= 40
        assert h * w >= 0.5 * 30 * 40 * 0.9  # rounding slack
