"""Tests `arguments.model`: --model_name_or_path is a local folder or a Hub id (checked without the network), and
--cache_dir a folder."""

import os
import re

import pytest

from hf_vit_scaling.arguments.model import ModelArguments
from hf_vit_scaling.errors import UserInputError


@pytest.mark.parametrize("name", ["google/vit-base-patch16-224", "google/vit-base-patch16-224-in21k", "vit-base"])
def test_hub_ids_pass_without_the_network(name):
    assert ModelArguments(model_name_or_path=name).model_name_or_path == name


def test_an_existing_folder_passes(tmp_path, monkeypatch):
    assert ModelArguments(model_name_or_path=str(tmp_path)).model_name_or_path == str(tmp_path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "best").mkdir(parents=True)
    assert ModelArguments(model_name_or_path="runs/best").model_name_or_path == "runs/best"  # a folder wins


@pytest.mark.parametrize("name", ["./no/such/folder", "../no-such-model", "/no/such/model", "~/no-such-model",
                                  "runs/no/such", "no-such-dir/"])  # fmt: skip
def test_a_local_path_that_does_not_exist_is_refused(name):
    with pytest.raises(UserInputError) as caught:
        ModelArguments(model_name_or_path=name)
    assert str(caught.value).startswith(f"--model_name_or_path {name!r} does not exist (no such folder, and not a "
                                        "Hub id owner/name). Fix: pass a saved model's folder")  # fmt: skip


def test_a_file_is_refused(tmp_path):
    a_file = tmp_path / "config.json"
    a_file.write_text("{}")
    with pytest.raises(
        UserInputError, match=re.escape(f"--model_name_or_path '{a_file}' is a file, not a folder. Fix:")
    ):
        ModelArguments(model_name_or_path=str(a_file))


def test_cache_dir_is_a_folder_or_made(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    with pytest.raises(UserInputError, match=re.escape(f"--cache_dir '{a_file}' is a file, not a folder. Fix:")):
        ModelArguments(cache_dir=str(a_file))
    with pytest.raises(UserInputError, match="^--cache_dir .* is inside .*, which is a file"):
        ModelArguments(cache_dir=os.path.join(a_file, "hub"))
    assert ModelArguments(cache_dir=str(tmp_path / "new")).cache_dir == str(tmp_path / "new")
