"""Tests `arguments.data`: the crop and flip defaults by image size."""

import pytest

from hf_vit_scaling.arguments.data import DataArguments


@pytest.mark.parametrize("flag, size, crops", [(None, 28, False), (None, 63, False), (None, 64, True),
                                               (None, 224, True), (True, 28, True), (False, 224, False)])  # fmt: skip
def test_crop_and_flip_default_by_image_size_unless_given(flag, size, crops):
    assert DataArguments(random_resized_crop=flag).crops_at(size) is crops
    assert DataArguments(horizontal_flip=flag).flips_at(size) is crops
