"""Tests `arguments.parser`: the parsers of the small scripts turn argparse's refusals and unknown flags into one
UserInputError line naming the flag and the script's --help, and no recipe's parse reads a `<script>.args` file."""

import shutil
import sys
from dataclasses import dataclass, field

import pytest

from hf_vit_scaling.arguments.parser import DataclassParser, ScriptParser
from hf_vit_scaling.errors import UserInputError
from tests.helpers.launchers import REPO


@dataclass
class _Settings:
    mode: str = field(default="a", metadata={"choices": ["a", "b"]})
    count: int = 1


def _script_parser() -> ScriptParser:
    parser = ScriptParser("recipes/some_script.py", "A script.")
    parser.add_argument("--mode", choices=["a", "b"], default="a")
    parser.add_argument("--count", type=int, default=1)
    return parser


def _dataclass_parser() -> DataclassParser:
    return DataclassParser(_Settings, prog="recipes/some_script.py")


def _parse(kind: str, argv: list[str]):
    return _script_parser().parse_args(argv) if kind == "script" else _dataclass_parser().parse_flags(argv)


@pytest.mark.parametrize("kind", ["script", "dataclass"])
@pytest.mark.parametrize(
    "argv, words",
    [(["--no_such_flag", "1"], ["--no_such_flag is not a flag of this script", "Fix: remove or rename it"]),
     (["--mode", "c"], ["argument --mode", "invalid choice: 'c'", "Fix: correct that flag"]),
     (["--count", "x"], ["argument --count", "invalid int value: 'x'"]),
     (["--nope", "--nor", "1"], ["--nope, --nor are not flags"])],
)  # fmt: skip
def test_refusals_are_one_line_naming_the_flag_and_the_help(kind, argv, words):
    """Fails if `error` is not overridden (argparse prints usage and raises SystemExit) or the unknown flags are left
    to argparse or to HfArgumentParser (a ValueError listing every leftover string)."""
    with pytest.raises(UserInputError) as caught:
        _parse(kind, argv)
    message = str(caught.value)
    assert "\n" not in message and "python recipes/some_script.py --help lists every flag" in message, message
    assert all(word in message for word in words), message


@pytest.mark.parametrize("kind", ["script", "dataclass"])
def test_known_flags_parse(kind):
    parsed = _parse(kind, ["--mode", "b", "--count", "3"])
    values = vars(parsed) if kind == "script" else vars(parsed[0])
    assert values == {"mode": "b", "count": 3}


def _parse_recipe(script: str, argv: list[str] | None):
    """The learning rate a recipe's own parse gives for `argv` (None: sys.argv[1:], as the recipe runs)."""
    from transformers import TrainingArguments

    from hf_vit_scaling.arguments.data import DataArguments
    from hf_vit_scaling.arguments.model import ModelArguments
    from hf_vit_scaling.arguments.parse import parse_args

    if script == "train_vit_minimal.py":
        parser = DataclassParser((ModelArguments, DataArguments, TrainingArguments), script=f"recipes/{script}")
        return parser.parse_flags(argv)[2].learning_rate
    return parse_args(argv, mae=script == "pretrain_mae.py").training.learning_rate


@pytest.mark.parametrize("script", ["train_vit.py", "pretrain_mae.py", "train_vit_minimal.py"])
@pytest.mark.parametrize("from_sys_argv", [False, True])
def test_an_args_file_beside_the_script_is_never_read(tmp_path, monkeypatch, script, from_sys_argv):
    """HfArgumentParser reads `<script>.args` beside the entry script (sys.argv[0]) by default and puts its flags in
    front of the command line's: a file nobody named would change the run. Only the command line counts (or a
    .json/.yaml file named on it first)."""
    copy = tmp_path / script
    shutil.copy(REPO / "recipes" / script, copy)
    copy.with_suffix(".args").write_text("--learning_rate 0.123\n")
    argv = ["--output_dir", str(tmp_path / "out")]
    monkeypatch.setattr(sys, "argv", [str(copy), *argv])
    learning_rate = _parse_recipe(script, None if from_sys_argv else argv)
    assert learning_rate != 0.123
    assert learning_rate == _parse_recipe(script, ["--output_dir", str(tmp_path / "out")])  # the default
