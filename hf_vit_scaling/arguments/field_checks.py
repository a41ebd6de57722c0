"""Checks of one field's value, shared by the argument dataclasses' `__post_init__` and by `parse`: one `error:` line
naming the flag."""

import dataclasses
import math
import os
import tempfile
import types
import typing

from hf_vit_scaling.errors import UserInputError


def require_at_least(args, minimum: float, *flags: str) -> None:
    """Each named field, when set, is at least `minimum`; else one error naming the flag."""
    for flag in flags:
        value = getattr(args, flag)
        if value is not None and value < minimum:
            raise UserInputError(
                f"--{flag} must be >= {minimum}, got {value}. Fix: pass a value of {minimum} or more."
            )


def _is_float_type(annotation) -> bool:
    if annotation is float:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [arg for arg in typing.get_args(annotation) if arg is not type(None)] == [float]
    return False


def float_fields(*classes) -> tuple[str, ...]:
    """The flags of these dataclasses that take a real number: their fields typed `float` or `float | None`."""
    return tuple(
        field.name for cls in classes for field in dataclasses.fields(cls) if field.init and _is_float_type(field.type)
    )


def require_finite(values: dict, flags) -> None:
    """Each named flag in `values` (parsed, not yet built into its dataclass) is a finite number: nan and inf pass
    every `<`/`>` range check in silence or crash deep in the Trainer. A string (from a YAML file, where `1e-4` is
    a string) becomes the float it spells, in place."""
    for flag in flags:
        value = values.get(flag)
        if isinstance(value, str):
            try:
                value = values[flag] = float(value)
            except ValueError:
                raise UserInputError(f"--{flag} {value!r} is not a number. Fix: pass a number, e.g. 0.1.") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise UserInputError(f"--{flag} must be a finite number, got {value}. Fix: pass a number, not nan or inf.")


def require_in_range(values: dict, ranges: dict) -> None:
    """`ranges`: {flag: (low, high, high_included, example)}, `low` included, `high` None for no upper bound. Each
    named flag present in `values` lies in its range; else one error naming the flag, the range and an example."""
    for flag, (low, high, high_included, example) in ranges.items():
        value = values.get(flag)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        if high is None:
            allowed, ok = f">= {low}", value >= low
        else:
            allowed = f"in [{low}, {high}{']' if high_included else ')'}"
            ok = low <= value <= high if high_included else low <= value < high
        if not ok:
            raise UserInputError(
                f"--{flag} must be {allowed}, got {value}. Fix: pass a value {allowed}, e.g. --{flag} {example}."
            )


def _nearest_existing(path: str) -> str:
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    return parent


def require_folder(flag: str, path: str | None, fix: str, created: bool = False) -> None:
    """`path`, when set, is a folder; with `created` (the run makes it) it may also not exist yet, as long as the
    nearest existing folder above it is a folder, not a file. Else one error naming the flag and the fix."""
    if not path or os.path.isdir(path):
        return
    if os.path.exists(path):
        raise UserInputError(f"--{flag} {path!r} is a file, not a folder. Fix: {fix}")
    if not created:
        raise UserInputError(f"--{flag} {path!r} does not exist. Fix: {fix}")
    parent = _nearest_existing(path)
    if not os.path.isdir(parent):
        raise UserInputError(f"--{flag} {path!r} is inside {parent!r}, which is a file, not a folder. Fix: {fix}")


WRITABLE_FIX = "pass a folder, or a path where one can be made."


def require_writable_folder(flag: str, path: str, fix: str = WRITABLE_FIX) -> None:
    """`--flag`'s folder exists, or can be made where it is asked for: a file in the way, or a place no folder can be
    made (read-only, no permission, /proc), gives one error now rather than a traceback after the expensive work.
    Checked by making and removing a temporary folder in the nearest existing folder: nothing is left behind."""
    require_folder(flag, path, fix, created=True)
    where = path if os.path.isdir(path) else _nearest_existing(path)
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".write-check-", dir=where))
    except OSError as err:
        raise UserInputError(f"--{flag} {path!r} cannot be made ({err.strerror or err}). Fix: {fix}") from err


def require_file(flag: str, path: str | None, fix: str) -> None:
    """`path`, when set, is a file (not a folder); else one error naming the flag and the fix."""
    if not path or os.path.isfile(path):
        return
    if os.path.isdir(path):
        raise UserInputError(f"--{flag} {path!r} is a folder, not a file. Fix: {fix}")
    raise UserInputError(f"--{flag} {path!r} does not exist. Fix: {fix}")


def refuse_given_flags(conditions: list[tuple[str, bool]], explain) -> None:
    """One error naming every flag of `conditions` ((flag, given) pairs) that is given; `explain(flags)` writes the
    message from the flags' names joined by commas. Nothing when none is given."""
    given = [flag for flag, on in conditions if on]
    if given:
        raise UserInputError(explain(", ".join(given)))
