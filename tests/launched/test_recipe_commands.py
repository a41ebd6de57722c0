"""The recipes' commands as users type them, in fresh processes: every `recipes/train_vit.py FILE` in a recipe
folder's README parses through the recipe's own `parse_args` (every check that runs before data or a model loads,
the DeepSpeed config's included; nothing is downloaded), and `--help` lists every flag."""

import dataclasses
import re
import sys
from functools import partial

import yaml

from hf_vit_scaling.arguments.parse import ALL_ARGUMENT_CLASSES
from tests.helpers.launchers import REPO, printed_json, run, side_by_side
from tests.helpers.readme import (
    RECIPE_FOLDERS,
    USER_FOLDER_KEYS,
    readme_commands,
    recipe_config_files,
    with_stand_in_folders,
)

# parse_args on each file in turn, in one process (the dry run: `--help` depth, no data, no model).
PARSE_ONLY = """
import json
import sys

from hf_vit_scaling.arguments.parse import parse_args

results = {}
for path in sys.argv[1:]:
    try:
        args = parse_args([path])
        training = args.training
    except Exception as err:
        results[path] = {"error": f"{err.__class__.__name__}: {err}"}
        continue
    results[path] = {"ds_config": args.run_engine.ds_config_path, "learning_rate": training.learning_rate,
                     "per_device_train_batch_size": training.per_device_train_batch_size}
print(json.dumps(results))
"""


def as_the_readme_runs_it(config: str, tmp_path):
    """The config file itself (relative to the repository root, as the README runs it), or, when it names data
    folders or a teacher (the user's, made by an earlier command), a copy whose folders are stand-ins: empty data
    folders, a teacher folder holding only a classifier's config (parse_args reads the config; weights load later)."""
    values = yaml.safe_load((REPO / config).read_text(encoding="utf-8"))
    if not any(key in values for key in USER_FOLDER_KEYS):
        return config
    values = with_stand_in_folders(values, tmp_path)
    copy = tmp_path / config.replace("/", "_")
    copy.write_text(yaml.safe_dump(values), encoding="utf-8")
    return str(copy)


def test_readme_configs_parse_through_the_recipes_parse_args(tmp_path):
    configs = sorted(
        {config for folder in RECIPE_FOLDERS for command in readme_commands(folder / "README.md")
         for config in recipe_config_files(command)}
    )  # fmt: skip
    assert {config.split("/")[1] for config in configs} >= {
        "fashion_mnist", "cifar100_study", "cifar_finetune", "imagenet_deit",
    }  # fmt: skip
    paths = [as_the_readme_runs_it(config, tmp_path) for config in configs]
    script = tmp_path / "parse_only.py"
    script.write_text(PARSE_ONLY, encoding="utf-8")
    proc = run([sys.executable, script, *paths], timeout=300)  # from the repository root
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = printed_json(proc)
    for config, path in zip(configs, paths):
        result, values = results[path], yaml.safe_load((REPO / config).read_text(encoding="utf-8"))
        assert "error" not in result, f"{config}: {result.get('error')}"
        assert result["ds_config"] == values.get("ds_config"), config
        assert result["learning_rate"] == values["learning_rate"], config
        assert result["per_device_train_batch_size"] == values["per_device_train_batch_size"], config


# The flags each recipe must list in --help: train_vit.py every field of its argument groups (ours and
# TrainingArguments'); the study the flag it sweeps.
HELP_FLAGS = {
    "train_vit.py": [f"--{f.name}" for cls in ALL_ARGUMENT_CLASSES for f in dataclasses.fields(cls) if f.init],
    "scaling_study.py": ["--simulate_slow_ranks"],
}


def test_help_lists_every_flag():
    helps = side_by_side(*(partial(run, [sys.executable, REPO / "recipes" / script, "--help"], timeout=120)
                           for script in HELP_FLAGS))  # fmt: skip
    for (script, flags), proc in zip(HELP_FLAGS.items(), helps, strict=True):
        assert proc.returncode == 0, proc.stderr[-2000:]
        missing = [flag for flag in flags if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", proc.stdout)]
        assert not missing, f"{script} --help does not list {missing}"
    assert {"--balance_batches", "--simulate_slow_ranks", "--ema_decay"} <= set(HELP_FLAGS["train_vit.py"])
