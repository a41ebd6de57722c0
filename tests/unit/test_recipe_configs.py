"""Every recipe config shipped in recipes/ parses as the recipe's flags: every key is a flag, every value passes
its field's checks (data folders are replaced by empty stand-ins: the configs name the user's folders)."""

import pytest
import yaml
from transformers import HfArgumentParser

from hf_vit_scaling.arguments import ALL_ARGUMENT_CLASSES, RecipeArguments
from tests.helpers import REPO

CONFIGS = sorted(REPO.glob("recipes/**/*.yaml"))


def test_there_are_recipe_configs():
    assert {p.parent.name for p in CONFIGS} >= {"recipes", "fashion_mnist", "medical_brain_mri"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(REPO / "recipes")))
def test_recipe_config_parses_into_the_recipe_flags(tmp_path, path):
    values = yaml.safe_load(path.read_text(encoding="utf-8"))
    for key in ("train_dir", "validation_dir"):
        if key in values:
            values[key] = str(tmp_path / key)
            (tmp_path / key).mkdir()
    values.update(bf16=False, use_cpu=True, output_dir=str(tmp_path / "out"))  # bf16 needs an accelerator
    args = RecipeArguments(*HfArgumentParser(ALL_ARGUMENT_CLASSES).parse_dict(values))
    assert args.training.output_dir == str(tmp_path / "out")
    assert args.model.preset or args.model.model_name_or_path
