"""Tests `data.input_path`: the choice between the device and the host-crop input paths."""

import pytest
import torch

from hf_vit_scaling.arguments.data import DataArguments
from hf_vit_scaling.data.device_transforms import collate_uint8_batch
from hf_vit_scaling.data.input_path import choose_input_path
from hf_vit_scaling.data.loading import load_image_classification_data
from hf_vit_scaling.errors import UserInputError
from tests.helpers.builders import MIXED, make_image_folder


def test_auto_picks_device_for_one_size_and_host_crop_for_mixed(tmp_path):
    digits = load_image_classification_data(DataArguments(max_train_samples=64, max_eval_samples=16))
    assert choose_input_path(digits, "auto") == "device"
    make_image_folder(tmp_path / "train", MIXED)
    mixed = load_image_classification_data(DataArguments(train_dir=str(tmp_path / "train"), train_val_split=0.25))
    assert choose_input_path(mixed, "auto") == "host_crop"
    assert choose_input_path(mixed, "device") == "device"  # the user's choice stands...
    with pytest.raises(UserInputError, match="--input_path host_crop"):  # ...and fails clearly at collate time
        collate_uint8_batch(
            [
                {"pixel_values": torch.zeros(3, 4, 4, dtype=torch.uint8), "labels": 0},
                {"pixel_values": torch.zeros(3, 5, 4, dtype=torch.uint8), "labels": 1},
            ]
        )
