"""Tests `arguments.data`: the image folders' checks (the crop and flip defaults by image size are data rules:
tests/unit/data/test_host_transforms.py)."""

import re

import pytest

from hf_vit_scaling.arguments.data import DataArguments
from hf_vit_scaling.errors import UserInputError


@pytest.mark.parametrize("flag", ["train_dir", "validation_dir"])
def test_image_folders_must_be_folders(tmp_path, flag):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    given = {"train_dir": str(tmp_path)} if flag == "validation_dir" else {}
    for path, words in ((a_file, "is a file, not a folder"), (tmp_path / "nope", "does not exist")):
        with pytest.raises(UserInputError, match=re.escape(f"--{flag} '{path}' {words}. Fix: point it at a folder")):
            DataArguments(**{**given, flag: str(path)})
    assert getattr(DataArguments(**{**given, flag: str(tmp_path)}), flag) == str(tmp_path)
