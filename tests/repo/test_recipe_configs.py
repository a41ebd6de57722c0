"""Every recipe config shipped in recipes/ parses as the recipe's flags: every key is a flag, every value passes
its field's checks (data folders are replaced by empty stand-ins and a teacher folder by a classifier's
config: the configs name the user's folders). Every recipe
folder has a README whose commands name configs that exist and which says what was measured here and what is a
reference figure from elsewhere. (Those commands' configs through the recipe's own `parse_args`, DeepSpeed config
included, and `--help`: tests/launched/test_recipe_commands.py, in a fresh process.)"""

import re

import pytest
import yaml
from transformers import HfArgumentParser

from hf_vit_scaling.arguments.mae import MaeArguments
from hf_vit_scaling.arguments.parse import ALL_ARGUMENT_CLASSES, RecipeArguments
from tests.helpers.launchers import REPO
from tests.helpers.readme import RECIPE_FOLDERS, readme_commands, recipe_config_files, with_stand_in_folders

CONFIGS = sorted(REPO.glob("recipes/**/*.yaml"))
# A line that states what was measured here and what is a reference figure: both words on one line.
MEASURED_VS_REFERENCE = re.compile(r"measured.*reference|reference.*measured", re.IGNORECASE)


def test_there_are_recipe_configs():
    assert {p.parent.name for p in CONFIGS} >= {
        "recipes", "fashion_mnist", "mae", "medical_brain_mri", "cifar100_study", "cifar_finetune", "imagenet_deit",
    }  # fmt: skip


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(REPO / "recipes")))
def test_recipe_config_parses_into_the_recipe_flags(tmp_path, path):
    values = with_stand_in_folders(yaml.safe_load(path.read_text(encoding="utf-8")), tmp_path)
    values.update(bf16=False, use_cpu=True, output_dir=str(tmp_path / "out"))  # bf16 needs an accelerator
    # recipes/pretrain_mae.py's configs (config_pretrain*.yaml) take its MAE group too; the others must not.
    pretraining = path.name.startswith("config_pretrain")
    groups = HfArgumentParser((*ALL_ARGUMENT_CLASSES, *([MaeArguments] if pretraining else []))).parse_dict(values)
    args = RecipeArguments(*groups[: len(ALL_ARGUMENT_CLASSES)], mae=groups[-1] if pretraining else None)
    assert (args.mae is not None) == pretraining
    assert args.training.output_dir == str(tmp_path / "out")
    assert args.model.preset or args.model.model_name_or_path


@pytest.mark.parametrize("folder", RECIPE_FOLDERS, ids=lambda p: p.name)
def test_recipe_folder_readme_commands_name_configs_that_exist(folder):
    readme = folder / "README.md"
    assert readme.is_file(), f"{folder.relative_to(REPO)} has no README.md"
    commands = readme_commands(readme)
    assert commands, f"{readme.relative_to(REPO)} has no ```bash block with the command"
    for command in commands:
        for config in recipe_config_files(command):
            assert (REPO / config).is_file(), f"{readme.relative_to(REPO)} runs {config}, which does not exist"


@pytest.mark.parametrize("folder", RECIPE_FOLDERS, ids=lambda p: p.name)
def test_recipe_folder_readme_says_what_was_measured_and_what_is_reference(folder):
    lines = (folder / "README.md").read_text(encoding="utf-8").splitlines()
    assert any(MEASURED_VS_REFERENCE.search(line) for line in lines), (
        f"{folder.name}/README.md: no line says what was measured here and what is a reference figure"
    )


def test_readme_parsing_joins_continuations_and_drops_comments(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(
        "```bash\n# a comment\ntorchrun --nnodes 2 \\\n    recipes/train_vit.py a/config_x.yaml  # trailing\n```\n"
        "```python\nrecipes/train_vit.py not_bash.yaml\n```\n"
    )
    commands = readme_commands(readme)
    assert commands == [["torchrun", "--nnodes", "2", "recipes/train_vit.py", "a/config_x.yaml"]]
    assert recipe_config_files(commands[0]) == ["a/config_x.yaml"]
    assert recipe_config_files(["python", "recipes/train_vit.py", "--ds_config", "ds_configs/zero2.json"]) == []
