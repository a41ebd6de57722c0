"""Command-line arguments shared by the recipes: dataclasses parsed by `HfArgumentParser` with `TrainingArguments`.

`--ds_config PATH` is the project's name for the Trainer's `--deepspeed PATH`: the parsed value (any spelling of the
flag, a file's key) stays in `EngineArguments.ds_config` and is resolved into `TrainingArguments.deepspeed` before
`TrainingArguments` is built, so there is one DeepSpeed code path. The engine is then read out of TrainingArguments
once, into `RecipeArguments.run_engine` (`parallel.engine.Engine`), which every later reader uses.

The parsed values are checked before any dataclass is built from them: every float flag (found from the fields'
types) must be finite, and TrainingArguments' numbers in range (`check_values`); a ValueError TrainingArguments
still raises while it is built becomes one `error:` line too.
"""

import argparse
import json
import os
import sys
from dataclasses import dataclass

import yaml
from transformers import HfArgumentParser, TrainingArguments

from hf_vit_scaling.arguments.checks import (
    check_restart_setup,
    check_training_values,
    keep_hub_token_out_of_arguments,
    validate_args,
)
from hf_vit_scaling.arguments.data import DataArguments
from hf_vit_scaling.arguments.distillation import DistillationArguments
from hf_vit_scaling.arguments.engine import ClusterArguments, EngineArguments, LearningRateArguments
from hf_vit_scaling.arguments.field_checks import float_fields, require_file, require_finite
from hf_vit_scaling.arguments.mae import MaeArguments, check_mae_run
from hf_vit_scaling.arguments.model import ModelArguments
from hf_vit_scaling.arguments.parser import DataclassParser
from hf_vit_scaling.arguments.regularization import RegularizationArguments
from hf_vit_scaling.arguments.reliability import ReliabilityArguments, ReportArguments
from hf_vit_scaling.arguments.streaming import StreamingArguments
from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.parallel.deepspeed_config import load_ds_config
from hf_vit_scaling.parallel.distributed import ensure_single_process_env
from hf_vit_scaling.parallel.engine import Engine, engine_of


@dataclass
class RecipeArguments:
    """Every argument group of a recipe run, by concern."""

    model: ModelArguments
    data: DataArguments
    engine: EngineArguments
    lr: LearningRateArguments
    cluster: ClusterArguments
    report: ReportArguments
    reliability: ReliabilityArguments
    regularization: RegularizationArguments
    streaming: StreamingArguments
    distillation: DistillationArguments
    training: TrainingArguments
    mae: MaeArguments | None = None  # recipes/pretrain_mae.py only (`parse_args(mae=True)`)
    run_engine: Engine | None = None  # DeepSpeed (its dict), FSDP2 or the plain Trainer: set once by `parse_args`


ALL_ARGUMENT_CLASSES = (
    ModelArguments,
    DataArguments,
    EngineArguments,
    LearningRateArguments,
    ClusterArguments,
    ReportArguments,
    ReliabilityArguments,
    RegularizationArguments,
    StreamingArguments,
    DistillationArguments,
    TrainingArguments,
)

FLOAT_FLAGS = float_fields(*ALL_ARGUMENT_CLASSES)


def help_fix(parser: HfArgumentParser) -> str:
    """Where the flags are listed: the recipe whose argument groups `parser` holds (MAE's group: pretrain_mae.py)."""
    mae = any(group.__name__ == "MaeArguments" for group in parser.dataclass_types)
    return f"python recipes/{'pretrain_mae.py' if mae else 'train_vit.py'} --help lists every flag"


def check_values(values: dict) -> None:
    """Checks of the parsed values before any dataclass is built from them (TrainingArguments' __post_init__
    crashes on some bad numbers and passes others in silence): float flags finite, TrainingArguments' in range."""
    require_finite(values, FLOAT_FLAGS)
    check_training_values(values)


class _CheckingParser(DataclassParser):
    """`DataclassParser` (one-line refusals) that runs `check_values` on the parsed flags before it builds the
    dataclasses."""

    what = "recipe"
    file_keys: frozenset = frozenset()  # the flags an arguments file set (its values are the parser's defaults)

    def help_hint(self) -> str:
        return help_fix(self)

    def parse_known_args(self, args=None, namespace=None):
        if namespace is None and "use_cpu" not in self.file_keys and not has_accelerator():
            # Without an accelerator, accelerate only sets up a multi-process (gloo) world when told it runs on CPU:
            # a value already in the namespace stands where no flag gives one (every spelling of --use_cpu still
            # wins), and --help keeps TrainingArguments' own default.
            namespace = argparse.Namespace(use_cpu=True)
        namespace, remaining = super().parse_known_args(args, namespace)
        values = vars(namespace)
        require_choices({key: values.get(key) for key in self.file_keys}, self)
        check_values(values)
        resolve_engine_values(vars(namespace))  # the namespace's own dict: what the dataclasses are built from
        return namespace, remaining


def _build(parser: HfArgumentParser, method: str, *args, **kwargs) -> tuple:
    """The dataclasses from the parser's `method` (parse_dict or parse_args_into_dataclasses); a bare ValueError from
    building them (TrainingArguments' own checks) becomes a UserInputError, on one line."""
    try:
        return getattr(parser, method)(*args, **kwargs)
    except UserInputError:
        raise
    except ValueError as err:
        message = " ".join(str(err).split()).rstrip(".")  # one line
        raise UserInputError(f"{message} (TrainingArguments). Fix: correct that flag ({help_fix(parser)}).") from err


def require_choices(values: dict, parser: HfArgumentParser) -> None:
    """A file's values become the parser's defaults, and argparse checks a flag's choices only on the command line:
    each parsed value of a flag the file set (`values`: a flag given again on the command line holds the checked
    command-line value) must be one of its choices. Else one error naming the flag, the value and the choices."""
    for action in parser._actions:
        value = values.get(action.dest)
        if action.choices is None or value is None:
            continue
        if str(value) not in {str(choice) for choice in action.choices}:
            allowed = ", ".join(str(choice) for choice in action.choices)
            raise UserInputError(f"--{action.dest} {value!r} is not one of {allowed}. Fix: pass one of them.")


def parse_problem(err: Exception) -> str:
    """A JSON/YAML parse error on one line: YAML's context and problem each with its line ("while parsing a flow
    sequence (line 2, column 16): expected ',' or ']', but got '<stream end>' (line 3, column 1)")."""
    if not hasattr(err, "problem_mark"):
        return " ".join(str(err).split())
    parts = []
    for text, mark in ((err.context, err.context_mark), (err.problem, err.problem_mark)):
        if text:
            parts.append(f"{text} (line {mark.line + 1}, column {mark.column + 1})" if mark else text)
    return ": ".join(parts)


def _read_args_file(path: str, flag: str | None = None) -> dict:
    """The values of a .json/.yaml file, or one error naming it (and `flag`, when a flag gave it), where the parser
    stopped and the fix, for a file that is not valid JSON/YAML or does not hold a mapping of flag names."""
    where = f"--{flag} {path!r}" if flag else f"Arguments file {path!r}"
    kind = "JSON" if path.endswith(".json") else "YAML"
    try:
        with open(path, encoding="utf-8") as f:
            values = json.load(f) if path.endswith(".json") else yaml.safe_load(f)
    except (json.JSONDecodeError, yaml.YAMLError, UnicodeDecodeError) as err:
        raise UserInputError(f"{where} is not valid {kind} ({parse_problem(err)}). Fix: correct the file.") from err
    if values is not None and not isinstance(values, dict):
        raise UserInputError(
            f"{where} holds a {type(values).__name__}, not a mapping of flag names to values. Fix: write one "
            "`flag_name: value` per line."
        )
    return values


def _resolve_ds_config(values: dict) -> None:
    """Read and check the DeepSpeed file once and hand TrainingArguments the dict (its `deepspeed` field takes a
    path or a dict): transformers builds its DeepSpeed config (accelerate's copy of the dict, which `engine_of` takes
    as `Engine.ds_config` and the project resolves in place) without opening the file again. `ds_config` keeps the path
    (EngineArguments.ds_config, whichever of --ds_config / --deepspeed named it) for the card and the reports."""
    ds_config, deepspeed = values.get("ds_config"), values.get("deepspeed")
    if ds_config and deepspeed and os.path.abspath(ds_config) != os.path.abspath(str(deepspeed)):
        raise UserInputError(
            f"--ds_config {ds_config!r} and --deepspeed {deepspeed!r} disagree. Fix: pass only one of them."
        )
    path = ds_config or deepspeed
    if path and isinstance(path, str):
        flag = "ds_config" if ds_config else "deepspeed"
        if os.path.isdir(path):  # (load_ds_config names a missing file)
            require_file(flag, path, "pass one of the files in ds_configs/ (e.g. ds_configs/zero2.json).")
        values["deepspeed"] = load_ds_config(path, flag=f"--{flag}")
        values["ds_config"] = path
        ensure_single_process_env()


def check_fsdp_config_file(path) -> None:
    """TrainingArguments opens --fsdp_config with a bare open()/json.load: name the flag and the fix instead."""
    if not isinstance(path, str) or path.lstrip().startswith("{"):
        return
    require_file("fsdp_config", path, "pass a file from fsdp_configs/.")
    _read_args_file(path, flag="fsdp_config")


def resolve_engine_values(values: dict) -> None:
    """The engine's files, from the parsed values (a flag's every spelling, a file's keys, overrides on top) before
    TrainingArguments is built from them: `ds_config` folded into `deepspeed` and the DeepSpeed and FSDP files
    checked. `parse_args` then reads the engine out of TrainingArguments once (`run_engine`)."""
    _resolve_ds_config(values)
    check_fsdp_config_file(values.get("fsdp_config"))


def run_engine(training, ds_config_path: str | None) -> Engine:
    """The engine TrainingArguments select, read out of them once (`parallel.engine.engine_of` takes the values):
    transformers' DeepSpeed config when --ds_config/--deepspeed is set (a path given to TrainingArguments directly
    is its own file name), else the FSDP plugin's arguments."""
    deepspeed = training.deepspeed
    if not deepspeed:
        return engine_of(fsdp_plugin_args=training.fsdp_plugin_args)
    path = deepspeed if isinstance(deepspeed, str) else ds_config_path
    return engine_of(training.hf_deepspeed_config, ds_config_path=path)


def has_accelerator() -> bool:
    import torch

    return torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())


def _is_args_file(arg: str) -> bool:
    return not arg.startswith("-") and arg.endswith((".json", ".yaml", ".yml"))


def _parse_args_file(parser: HfArgumentParser, path: str, overrides: list[str]) -> tuple:
    """The values of one .json/.yaml file, then any `--flag value` after it on top (as the alignment-handbook's
    `train.py config.yaml --learning_rate 1e-4`): the file's values become the parser's defaults."""
    if not os.path.isfile(path):
        raise UserInputError(f"Arguments file {path!r} does not exist. Fix: pass an existing .json/.yaml file.")
    values = _read_args_file(path) or {}
    # Without an accelerator, accelerate only sets up a multi-process (gloo) world when told it runs on CPU.
    values.setdefault("use_cpu", not has_accelerator())
    parser.refuse_unknown(sorted(set(values) - {action.dest for action in parser._actions}), where=f"{path}: ")
    if not overrides:  # parse_dict: no parse_known_args, so its checks run here
        require_choices(values, parser)
        check_values(values)
        resolve_engine_values(values)
        return _build(parser, "parse_dict", values)
    parser.set_defaults(**values)  # every action of a flag (a bool's --no_<flag> too) takes the file's value
    parser.file_keys = frozenset(values)  # their parsed values are checked against the choices (parse_known_args)
    for action in parser._actions:
        action.required = action.required and action.dest not in values
    return _parse_flags(parser, overrides)


def _parse_flags(parser: HfArgumentParser, argv: list[str]) -> tuple:
    *groups, remaining = _build(parser, "parse_args_into_dataclasses", argv, return_remaining_strings=True)
    parser.refuse_unknown(remaining)
    return tuple(groups)


def _parse(argv: list[str], extra_classes: tuple = ()) -> tuple:
    """The dataclasses from argv or from one .json/.yaml file (plus overrides after it); `--ds_config` resolved into
    `deepspeed` from the parsed values (`resolve_engine_values`). `extra_classes`: a recipe's own groups, after the
    shared ones."""
    parser = _CheckingParser((*ALL_ARGUMENT_CLASSES, *extra_classes))
    if argv and _is_args_file(argv[0]):
        return _parse_args_file(parser, argv[0], argv[1:])
    return _parse_flags(parser, argv)


def parse_args(argv: list[str] | None = None, mae: bool = False) -> RecipeArguments:
    """Parse every argument group from argv (or one .json/.yaml file) and check them together, before anything
    loads. Field checks live in each dataclass's `__post_init__`; checks across groups are in `validate_args`.
    `mae`: recipes/pretrain_mae.py's flags too (`MaeArguments`), and its refusals (`check_mae_run`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = RecipeArguments(*_parse(argv, (MaeArguments,) if mae else ()))
    # The one read of the engine: every later reader uses this object.
    args.run_engine = run_engine(args.training, args.engine.ds_config)
    keep_hub_token_out_of_arguments(args.training)
    if mae:
        check_mae_run(args)
    validate_args(args)
    check_restart_setup(args.training, os.environ)
    return args
