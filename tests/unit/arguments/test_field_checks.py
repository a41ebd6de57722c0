"""Tests `arguments.field_checks`: float flags found by type, ranges, and the folder/file checks of path flags."""

from dataclasses import dataclass, field

import pytest

from hf_vit_scaling.arguments.field_checks import (
    float_fields,
    require_file,
    require_finite,
    require_folder,
    require_in_range,
)
from hf_vit_scaling.errors import UserInputError


@dataclass
class _Flags:
    rate: float = 0.1
    optional_rate: float | None = None
    steps: int = 1
    name: str | None = None
    derived: float = field(default=0.0, init=False)


def test_float_fields_are_the_float_and_optional_float_init_fields():
    assert float_fields(_Flags) == ("rate", "optional_rate")


def test_require_finite_names_the_flag_and_reads_strings():
    values = {"rate": "1e-4", "optional_rate": None}
    require_finite(values, ("rate", "optional_rate", "absent"))
    assert values["rate"] == 1e-4
    with pytest.raises(UserInputError, match=r"^--rate must be a finite number, got inf\. Fix:"):
        require_finite({"rate": float("inf")}, ("rate",))


def test_require_in_range_says_the_range():
    ranges = {"beta": (0, 1, False, 0.9), "decay": (0, None, False, 0.05), "p": (0, 1, True, 0.5)}
    require_in_range({"beta": 0.0, "decay": 0, "p": 1.0, "other": -1}, ranges)
    for values, message in (
        ({"beta": 1.0}, "--beta must be in [0, 1), got 1.0. Fix: pass a value in [0, 1), e.g. --beta 0.9."),
        ({"decay": -1}, "--decay must be >= 0, got -1. Fix: pass a value >= 0, e.g. --decay 0.05."),
        ({"p": 1.5}, "--p must be in [0, 1], got 1.5. Fix: pass a value in [0, 1], e.g. --p 0.5."),
    ):
        with pytest.raises(UserInputError) as caught:
            require_in_range(values, ranges)
        assert str(caught.value) == message


def test_require_folder_and_require_file_name_the_wrong_kind(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    require_folder("dir", str(tmp_path), "fix.")
    require_folder("dir", str(tmp_path / "new" / "deeper"), "fix.", created=True)
    require_file("config", str(a_file), "fix.")
    for check, message in (
        (lambda: require_folder("dir", str(a_file), "fix."), f"--dir '{a_file}' is a file, not a folder. Fix: fix."),
        (lambda: require_folder("dir", str(tmp_path / "nope"), "fix."), "does not exist. Fix: fix."),
        (lambda: require_folder("dir", str(a_file / "x"), "fix.", created=True), f"is inside '{a_file}', which is"),
        (lambda: require_file("config", str(tmp_path), "fix."), f"--config '{tmp_path}' is a folder, not a file."),
        (lambda: require_file("config", str(tmp_path / "nope.json"), "fix."), "nope.json' does not exist. Fix:"),
    ):
        with pytest.raises(UserInputError) as caught:
            check()
        assert message in str(caught.value)
