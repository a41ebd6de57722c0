"""Tests `arguments.parser`: the parsers of the small scripts turn argparse's refusals and unknown flags into one
UserInputError line naming the flag and the script's --help."""

from dataclasses import dataclass, field

import pytest

from hf_vit_scaling.arguments.parser import DataclassParser, ScriptParser
from hf_vit_scaling.errors import UserInputError


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
