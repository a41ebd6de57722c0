"""Checks of one field's value, shared by the argument dataclasses' `__post_init__`: one `error:` line naming the
flag."""

from hf_vit_scaling.errors import UserInputError


def require_at_least(args, minimum: float, *flags: str) -> None:
    """Each named field, when set, is at least `minimum`; else one error naming the flag."""
    for flag in flags:
        value = getattr(args, flag)
        if value is not None and value < minimum:
            raise UserInputError(
                f"--{flag} must be >= {minimum}, got {value}. Fix: pass a value of {minimum} or more."
            )
