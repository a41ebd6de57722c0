"""Tests `data.input_path`: the choice between the device, host-crop and per-sample input paths, and the CPU probe
that decides between host_crop and per_sample on a CPU-only run (`data.input_transforms`)."""

import random
from functools import partial

import numpy as np
import pytest
import torch

from hf_vit_scaling.arguments.data import DataArguments
from hf_vit_scaling.data.device_transforms import EvalCenterCrop, collate_uint8_batch
from hf_vit_scaling.data.input_path import RESOLVED_PATHS, choose_input_path, input_path_named, resolve_input_path
from hf_vit_scaling.data.input_transforms import build_input_transforms, cpu_seconds_per_image
from hf_vit_scaling.data.loading import load_image_classification_data
from hf_vit_scaling.errors import UserInputError
from tests.helpers.builders import MIXED, make_image_folder


def test_auto_picks_device_for_one_size_and_host_crop_for_mixed(tmp_path):
    digits = load_image_classification_data(DataArguments(max_train_samples=64, max_eval_samples=16))
    assert choose_input_path(digits, "auto").name == "device"
    make_image_folder(tmp_path / "train", MIXED)
    mixed = load_image_classification_data(DataArguments(train_dir=str(tmp_path / "train"), train_val_split=0.25))
    assert choose_input_path(mixed, "auto").name == "host_crop"
    assert choose_input_path(mixed, "device").name == "device"  # the user's choice stands...
    with pytest.raises(UserInputError, match="--input_path host_crop"):  # ...and fails clearly at collate time
        collate_uint8_batch(
            [
                {"pixel_values": torch.zeros(3, 4, 4, dtype=torch.uint8), "labels": 0},
                {"pixel_values": torch.zeros(3, 5, 4, dtype=torch.uint8), "labels": 1},
            ]
        )


def _mixed(tmp_path):
    make_image_folder(tmp_path / "train", MIXED * 4)
    return load_image_classification_data(DataArguments(train_dir=str(tmp_path / "train"), train_val_split=0.1))


@pytest.mark.parametrize("cheaper", ["host_crop", "per_sample"])
def test_auto_on_a_cpu_picks_the_path_with_less_cpu_time_and_says_why(tmp_path, cheaper):
    """On a CPU-only run the "device" half runs on the host too: auto takes whichever path costs less in total."""
    mixed = _mixed(tmp_path)
    seconds = {"host_crop": 0.004, "per_sample": 0.004}
    seconds[cheaper] = 0.002
    asked = []

    def timer(paths):
        asked.append(paths)
        return seconds

    path, why = resolve_input_path(mixed, "auto", timer)
    assert path == cheaper and asked == [("host_crop", "per_sample")]
    assert "host_crop 4.00 ms" in why or "host_crop 2.00 ms" in why
    assert resolve_input_path(mixed, "auto", None)[0] == "host_crop"  # with an accelerator: the host-light path
    assert resolve_input_path(mixed, "per_sample", timer)[0] == "per_sample" and len(asked) == 1  # no probe


def test_cpu_probe_times_both_paths_end_to_end_and_leaves_the_random_state_alone(tmp_path):
    mixed = _mixed(tmp_path)
    build = partial(build_input_transforms, size=16, mean=[0.5] * 3, std=[0.5] * 3, data_args=DataArguments())
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    before = random.random(), np.random.rand(), torch.rand(1)
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    seconds = cpu_seconds_per_image(mixed, ("host_crop", "per_sample"), build, batch=4, rounds=2)
    assert set(seconds) == {"host_crop", "per_sample"} and all(v > 0 for v in seconds.values())
    assert (random.random(), np.random.rand(), torch.rand(1)) == before
    assert mixed.splits["train"][0]["image"] is not None  # the run's own splits keep their transform-free rows


def test_each_path_object_says_what_it_does_on_each_side():
    """Fails if an `InputPath` gives the wrong device half (host_crop's preprocessor must leave the crop to the
    host), the wrong collate, or an eval crop on the device where the host cuts it (host_crop) or none runs."""
    data_args = DataArguments(random_resized_crop=True, crop_scale_min=0.5)
    device, host_crop, per_sample = (RESOLVED_PATHS[name] for name in ("device", "host_crop", "per_sample"))
    assert device.preprocessor(16, [0.5] * 3, [0.5] * 3, data_args).crop
    assert not host_crop.preprocessor(16, [0.5] * 3, [0.5] * 3, data_args).crop
    assert per_sample.preprocessor(16, [0.5] * 3, [0.5] * 3, data_args) is None
    assert device.collate is collate_uint8_batch and host_crop.collate is collate_uint8_batch
    assert per_sample.collate is not collate_uint8_batch
    assert isinstance(device.eval_crop(16, 0.875), EvalCenterCrop) and device.eval_crop(16, None) is None
    assert host_crop.eval_crop(16, 0.875) is None and per_sample.eval_crop(16, 0.875) is None
    assert input_path_named("host_crop") is host_crop and input_path_named(device) is device
