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
