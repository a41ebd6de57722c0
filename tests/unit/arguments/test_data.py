"""Tests `arguments.data`: the crop and flip defaults by image size, the image folders' checks."""

import re

import pytest

from hf_vit_scaling.arguments.data import DataArguments
from hf_vit_scaling.errors import UserInputError


@pytest.mark.parametrize("flag, size, crops", [(None, 28, False), (None, 63, False), (None, 64, True),
                                               (None, 224, True), (True, 28, True), (False, 224, False)])  # fmt: skip
def test_crop_and_flip_default_by_image_size_unless_given(flag, size, crops):
    assert DataArguments(random_resized_crop=flag).crops_at(size) is crops
    assert DataArguments(horizontal_flip=flag).flips_at(size) is crops


@pytest.mark.parametrize("flag", ["train_dir", "validation_dir"])
def test_image_folders_must_be_folders(tmp_path, flag):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    given = {"train_dir": str(tmp_path)} if flag == "validation_dir" else {}
    for path, words in ((a_file, "is a file, not a folder"), (tmp_path / "nope", "does not exist")):
        with pytest.raises(UserInputError, match=re.escape(f"--{flag} '{path}' {words}. Fix: point it at a folder")):
            DataArguments(**{**given, flag: str(path)})
    assert getattr(DataArguments(**{**given, flag: str(tmp_path)}), flag) == str(tmp_path)
