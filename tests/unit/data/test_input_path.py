"""Tests `data.input_path`: the choice between the device, host-crop and per-sample input paths, and the CPU probe
that decides between host_crop and per_sample on a CPU-only run (`data.input_transforms`)."""

import random
from functools import partial

import numpy as np
import pytest
import torch

from hf_vit_scaling.arguments.data import DataArguments
from hf_vit_scaling.data.device_transforms import collate_uint8_batch
from hf_vit_scaling.data.input_path import choose_input_path, resolve_input_path
from hf_vit_scaling.data.input_transforms import build_input_transforms, cpu_seconds_per_image
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
