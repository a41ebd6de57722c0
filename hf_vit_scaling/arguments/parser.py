"""The parsers every script under recipes/ builds its command line with: argparse's own refusals (an unknown flag, a
value outside a flag's choices, a missing required flag, a value of the wrong type) become one `error: ... Fix: ...`
line and exit 2 (a UserInputError, which each script turns into that line), never usage text, argparse's
`prog: error:` or HfArgumentParser's ValueError traceback.

A light module (argparse and transformers' HfArgumentParser only): the small scripts import it without the recipe's
argument groups.
"""

import argparse

from transformers import HfArgumentParser

from hf_vit_scaling.errors import UserInputError


def unknown_flags_message(given: list[str], help_hint: str, where: str = "", what: str = "script") -> str:
    """One line naming the unknown flags `given` (their values left out when flags are among them)."""
    unknown = [arg for arg in given if arg.startswith("-")] or given
    one = len(unknown) == 1
    return (
        f"{where}{', '.join(unknown)} {'is not a flag' if one else 'are not flags'} of this {what}. Fix: remove or "
        f"rename {'it' if one else 'them'} ({help_hint})."
    )


class OneLineErrors:
    """A parser mixin: argparse's refusals and leftover (unknown) arguments raise a UserInputError on one line."""

    what = "script"  # the message's noun: "--x is not a flag of this script"
    script: str | None = None  # the script's path from the repository root, for the Fix: (else argparse's prog)

    def help_hint(self) -> str:
        """Where the flags are listed, for the Fix: part of a message."""
        return f"python {self.script or self.prog} --help lists every flag"

    def error(self, message: str):
        """argparse calls this for every refusal of its own (it would print usage and exit 2)."""
        raise UserInputError(f"{' '.join(message.split())}. Fix: correct that flag ({self.help_hint()}).")

    def refuse_unknown(self, remaining: list[str], where: str = "") -> None:
        """One error naming the arguments no flag took, if any."""
        if remaining:
            raise UserInputError(unknown_flags_message(remaining, self.help_hint(), where, self.what))

    def parse_args(self, args=None, namespace=None):
        namespace, remaining = self.parse_known_args(args, namespace)
        self.refuse_unknown(remaining)
        return namespace


class ScriptParser(OneLineErrors, argparse.ArgumentParser):
    """`argparse.ArgumentParser` with one-line refusals; `script` is the script's path from the repository root
    (recipes/prepare_shards.py), so the Fix: names the command that lists its flags (`--help` keeps argparse's own
    program name)."""

    def __init__(self, script: str, description: str | None = None, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(description=description, **kwargs)
        self.script = script


def deepspeed_for_the_trainer(path: str) -> dict:
    """--deepspeed FILE as TrainingArguments should get it: the file read and checked (one error line for a bad one),
    the keys the Trainer owns that it leaves out set to "auto" (a bare `{"zero_optimization": {"stage": 2}}` trains),
    and, with no launcher, a one-process world declared as torchrun would (DeepSpeed would try MPI discovery)."""
    from hf_vit_scaling.parallel.deepspeed_config import load_ds_config
    from hf_vit_scaling.parallel.distributed import ensure_single_process_env
    from hf_vit_scaling.parallel.engine_routes import fill_left_out_keys

    config = load_ds_config(path, flag="--deepspeed")
    fill_left_out_keys(config)
    ensure_single_process_env()
    return config


class DataclassParser(OneLineErrors, HfArgumentParser):
    """`HfArgumentParser` with one-line refusals: `parse_flags` returns the dataclasses, and an unknown flag is one
    error naming it (HfArgumentParser raises a bare ValueError listing every leftover string); no `.args` file is
    read. `script`: as for `ScriptParser`."""

    reads_deepspeed_file = True  # --deepspeed FILE read here (`deepspeed_for_the_trainer`); the recipes' parser
    # resolves every route to an engine itself (arguments/parse.py)

    def __init__(self, dataclass_types, script: str | None = None, **kwargs):
        super().__init__(dataclass_types, **kwargs)
        self.script = script

    def parse_args_into_dataclasses(self, args=None, return_remaining_strings=False):
        """HfArgumentParser's, without its arguments files: by default it reads `<script>.args` beside the entry
        script (sys.argv[0]) and puts that file's flags in front of the command line's, so a file nobody named would
        change the run. Only the command line gives values (or one .json/.yaml file named first: `arguments.parse`)."""
        return super().parse_args_into_dataclasses(args, return_remaining_strings, look_for_args_file=False)

    def parse_known_args(self, args=None, namespace=None):
        namespace, remaining = super().parse_known_args(args, namespace)
        if self.reads_deepspeed_file and isinstance(getattr(namespace, "deepspeed", None), str):
            namespace.deepspeed = deepspeed_for_the_trainer(namespace.deepspeed)
        return namespace, remaining

    def parse_flags(self, argv: list[str] | None = None) -> tuple:
        *groups, remaining = self.parse_args_into_dataclasses(argv, return_remaining_strings=True)
        self.refuse_unknown(remaining)
        return tuple(groups)
