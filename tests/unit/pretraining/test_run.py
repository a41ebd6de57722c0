"""The k-NN probe's images (pretraining/run.py `knn_split`): --knn_train_samples training images and
--knn_eval_samples validation images, evenly spaced through each split (both classes of a class-sorted folder), with
their labels, through the run's input path with the evaluation
transforms (the same pixels at every read: no random crop or flip), leaving the training split's own transforms
alone."""

import dataclasses

import pytest
import torch

from hf_vit_scaling.arguments.parse import parse_args
from hf_vit_scaling.data import load_image_classification_data
from hf_vit_scaling.data.input_transforms import build_input_transforms
from hf_vit_scaling.pretraining.run import knn_split, spread_rows
from hf_vit_scaling.pretraining.trainer import WithoutLabels


@pytest.mark.parametrize("input_path", ["device", "per_sample"])
def test_knn_split_holds_spread_images_of_each_split_with_eval_transforms(tmp_path, input_path):
    args = parse_args(["--output_dir", str(tmp_path), "--image_size", "16", "--knn_train_samples", "30",
                       "--knn_eval_samples", "12", "--input_path", input_path], mae=True)  # fmt: skip
    data = load_image_classification_data(args.data, seed=0)
    train_labels = [data.splits["train"]["label"][row] for row in spread_rows(len(data.splits["train"]), 30)]
    eval_labels = [data.splits["validation"]["label"][row] for row in spread_rows(len(data.splits["validation"]), 12)]
    splits, collate, _ = build_input_transforms(data, input_path, 16, [0.5] * 3, [0.5] * 3, args.data)
    inputs = dataclasses.make_dataclass("Inputs", ["splits", "collate", "input_path"])(splits, collate, input_path)
    split, bank, queries, knn_collate = knn_split(args, data, inputs, 16, [0.5] * 3, [0.5] * 3)
    assert (bank, queries) == (list(range(30)), list(range(30, 42)))
    batch = knn_collate([split[row] for row in bank + queries])
    assert batch["labels"].tolist() == train_labels + eval_labels
    again = knn_collate([split[row] for row in bank + queries])
    assert torch.equal(batch["pixel_values"], again["pixel_values"])  # evaluation transforms: no randomness
    assert batch["pixel_values"].dtype == (torch.uint8 if input_path == "device" else torch.float32)
    # The Trainer's batches leave the labels out (MAE's forward takes pixels only); the probe keeps them.
    assert "labels" not in WithoutLabels(collate)([splits["train"][0], splits["train"][1]])


def test_prepare_mae_training_schedules_evaluation_and_wraps_mae_blocks_under_fsdp(tmp_path):
    from types import SimpleNamespace

    from transformers.trainer_utils import IntervalStrategy

    from hf_vit_scaling.pretraining.run import prepare_mae_training

    args = parse_args(["--output_dir", str(tmp_path), "--knn_eval_steps", "50"], mae=True)
    prepare_mae_training(args.training, args.mae)
    assert (args.training.eval_strategy, args.training.eval_steps) == (IntervalStrategy.STEPS, 50)
    plain = parse_args(["--output_dir", str(tmp_path)], mae=True)
    prepare_mae_training(plain.training, plain.mae)
    assert plain.training.eval_strategy == IntervalStrategy.NO  # the end-of-run evaluation only
    # --fsdp (2+ processes): TrainingArguments' plugin arguments from fsdp_configs/fsdp2.json name the classifier's
    # block; the MAE model has transformers' ViTMAELayer (encoder and decoder) instead.
    fsdp = SimpleNamespace(fsdp_plugin_args={"transformer_cls_names_to_wrap": "ViTLayer", "fsdp_version": 2},
                           fsdp_config={"transformer_layer_cls_to_wrap": ["ViTLayer"]})  # fmt: skip
    prepare_mae_training(fsdp, plain.mae)
    assert fsdp.fsdp_plugin_args["transformer_cls_names_to_wrap"] == "ViTMAELayer"
    assert fsdp.fsdp_config["transformer_layer_cls_to_wrap"] == ["ViTMAELayer"]


def test_spread_rows_are_evenly_spaced_distinct_and_cover_the_split():
    assert spread_rows(10, 5) == [0, 2, 4, 6, 8]
    assert spread_rows(4, 9) == [0, 1, 2, 3]  # more asked than there are: every row once
    assert spread_rows(7, 0) == [] and spread_rows(0, 5) == []
    rows = spread_rows(2100, 1000)
    assert len(set(rows)) == 1000 and rows[-1] >= 2097


def test_the_probe_of_a_class_sorted_image_folder_sees_every_class(tmp_path):
    """Br35H's train folder lists 1,049 "no" images, then the "yes" ones: a bank of its first rows held one class and
    the k-NN accuracy sat at the majority share (0.5011) whatever the encoder learned."""
    from PIL import Image

    for label, count in (("no", 40), ("yes", 12)):
        for split, n in (("train", count), ("validation", count // 4)):
            folder = tmp_path / split / label
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                Image.new("RGB", (16, 16), (i * 5, 0, 0)).save(folder / f"{i}.png")
    args = parse_args(["--output_dir", str(tmp_path / "out"), "--train_dir", str(tmp_path / "train"),
                       "--validation_dir", str(tmp_path / "validation"), "--image_size", "16",
                       "--knn_train_samples", "20", "--knn_eval_samples", "6"], mae=True)  # fmt: skip
    data = load_image_classification_data(args.data, seed=0)
    assert data.splits["train"]["label"][:20] == [0] * 20  # the folder's order: one class first
    splits, collate, _ = build_input_transforms(data, "per_sample", 16, [0.5] * 3, [0.5] * 3, args.data)
    inputs = dataclasses.make_dataclass("Inputs", ["splits", "collate", "input_path"])(splits, collate, "per_sample")
    split, bank, queries, knn_collate = knn_split(args, data, inputs, 16, [0.5] * 3, [0.5] * 3)
    assert set(knn_collate([split[row] for row in bank])["labels"].tolist()) == {0, 1}
    assert set(knn_collate([split[row] for row in queries])["labels"].tolist()) == {0, 1}
