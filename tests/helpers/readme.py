"""Reading the repository's READMEs: the recipe folders, the commands of their ```bash blocks, and the config files
a command names."""

import re
import shlex
from pathlib import Path

from tests.helpers.launchers import REPO

RECIPE_FOLDERS = sorted(p for p in (REPO / "recipes").iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))


BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.MULTILINE | re.DOTALL)


def readme_commands(readme) -> list[list[str]]:
    """The commands of a README's ```bash blocks, split into words as the shell would: continuation lines joined,
    comments dropped."""
    commands = []
    for block in BASH_BLOCK.findall(Path(readme).read_text(encoding="utf-8")):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                commands.append(words)
    return commands


def recipe_config_files(command: list[str]) -> list[str]:
    """The arguments file of each `recipes/train_vit.py FILE` in a command (FILE: .yaml, .yml or .json)."""
    return [
        after
        for word, after in zip(command, command[1:])
        if word.endswith("recipes/train_vit.py") and after.endswith((".yaml", ".yml", ".json"))
    ]


# Keys of a recipe config that name the user's folders, made by the user or by an earlier command.
USER_FOLDER_KEYS = ("train_dir", "validation_dir", "teacher_model")


def with_stand_in_folders(values: dict, tmp_path) -> dict:
    """A config's values with the user's folders replaced by stand-ins under `tmp_path`: empty data folders, and a
    teacher folder holding only a classifier's config (the recipe's checks read the config; weights load later)."""
    values = dict(values)
    for key in ("train_dir", "validation_dir"):
        if key in values:
            values[key] = str(tmp_path / key)
            (tmp_path / key).mkdir(exist_ok=True)
    if "teacher_model" in values:
        from transformers import ResNetConfig

        ResNetConfig(num_labels=10).save_pretrained(tmp_path / "teacher")
        values["teacher_model"] = str(tmp_path / "teacher")
    return values
