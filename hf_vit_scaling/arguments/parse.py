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
from hf_vit_scaling.parallel.deepspeed_config import check_zero_values, load_ds_config
from hf_vit_scaling.parallel.distributed import ensure_single_process_env
from hf_vit_scaling.parallel.engine import Engine, engine_of
from hf_vit_scaling.parallel.engine_routes import (
    NO_ROUTE,
    EngineRoute,
    accelerate_deepspeed,
    accelerate_fsdp,
    fill_left_out_keys,
    refuse_other_deepspeed,
    refuse_other_stage,
    refuse_two_engines,
)


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
    reads_deepspeed_file = False  # every route to an engine is resolved below (`resolve_engine_values`)
    file_keys: frozenset = frozenset()  # the flags an arguments file set (its values are the parser's defaults)
    engine_route: EngineRoute = NO_ROUTE  # how the engine was named (`resolve_engine_values`)

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
        # The namespace's own dict: what the dataclasses are built from
        self.engine_route = resolve_engine_values(vars(namespace))
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


def _flags_deepspeed(values: dict) -> tuple[str | None, str | None]:
    """(the DeepSpeed file the script's flags name, the flag), whichever of --ds_config / --deepspeed named it; one
    error when both name different files."""
    ds_config, deepspeed = values.get("ds_config"), values.get("deepspeed")
    if ds_config and deepspeed and os.path.abspath(ds_config) != os.path.abspath(str(deepspeed)):
        raise UserInputError(
            f"--ds_config {ds_config!r} and --deepspeed {deepspeed!r} disagree. Fix: pass only one of them."
        )
    path = ds_config or deepspeed
    return (path, "ds_config" if ds_config else "deepspeed") if path and isinstance(path, str) else (None, None)


def _read_ds_file(path: str, flag: str) -> dict:
    if os.path.isdir(path):  # (load_ds_config names a missing file)
        require_file(flag, path, "pass one of the files in ds_configs/ (e.g. ds_configs/zero2.json).")
    return load_ds_config(path, flag=f"--{flag}" if not flag.startswith("accelerate") else flag)


def _resolve_ds_config(values: dict, environ=os.environ) -> EngineRoute:
    """Every route to an engine (`parallel/engine_routes.py`) into TrainingArguments' own fields, before it is built:
    the DeepSpeed file of --ds_config / --deepspeed, or the one accelerate's DeepSpeed plugin names, or accelerate's
    own fields, read and checked once and handed to TrainingArguments as the dict (its `deepspeed` field takes a path
    or a dict), with the Trainer-owned keys the file leaves out set to "auto"; accelerate's FSDP plugin as --fsdp
    with its fsdp_config. transformers builds its DeepSpeed config (the dict `engine_of` takes as `Engine.ds_config`
    and the project resolves in place) without opening the file again. `ds_config` keeps the file's path for the
    card and the reports. Two routes that name different engines, files or stages are one error."""
    path, flag = _flags_deepspeed(values)
    accelerate_ds, accelerate_fsdp_config = accelerate_deepspeed(environ), accelerate_fsdp(environ)
    if accelerate_fsdp_config is not None and path:
        refuse_two_engines(f"--{flag} {path!r}", "accelerate's FSDP plugin (distributed_type FSDP, --use_fsdp)")
    if accelerate_ds is not None and values.get("fsdp"):
        refuse_two_engines("--fsdp", accelerate_ds[1])
    if path:
        config, route = _read_ds_file(path, flag), f"--{flag} {path}"
        if accelerate_ds is not None:
            refuse_other_deepspeed(path, config, *accelerate_ds)
            route += f" (also named by {accelerate_ds[1]})"
    elif accelerate_ds is not None:
        source, route = accelerate_ds
        if isinstance(source, str):
            config = _read_ds_file(source, "accelerate's deepspeed_config_file")
            refuse_other_stage(source, config, route, environ)
            values["ds_config"] = source
        else:
            config = source
            check_zero_values(config.get("zero_optimization", {}), route, "accelerate launch")
    elif isinstance(values.get("deepspeed"), dict):  # an arguments file's `deepspeed:` mapping
        config, route = values["deepspeed"], "--deepspeed (a mapping in the arguments file)"
    elif accelerate_fsdp_config is not None and not values.get("fsdp"):
        values["fsdp"] = True
        values["fsdp_config"] = accelerate_fsdp_config
        return EngineRoute(f"accelerate's FSDP plugin (fsdp_version {accelerate_fsdp_config.get('version', 1)})")
    else:
        fsdp_route = f"--fsdp --fsdp_config {values.get('fsdp_config')}"
        return EngineRoute(fsdp_route) if values.get("fsdp") else NO_ROUTE
    filled = fill_left_out_keys(config)
    values["deepspeed"] = config
    values["ds_config"] = values.get("ds_config") or path
    ensure_single_process_env()
    return EngineRoute(route, filled)


def check_fsdp_config_file(path) -> None:
    """TrainingArguments opens --fsdp_config with a bare open()/json.load: name the flag and the fix instead."""
    if not isinstance(path, str) or path.lstrip().startswith("{"):
        return
    require_file("fsdp_config", path, "pass a file from fsdp_configs/.")
    _read_args_file(path, flag="fsdp_config")


def resolve_engine_values(values: dict) -> EngineRoute:
    """The engine's files, from the parsed values (a flag's every spelling, a file's keys, overrides on top) and the
    plugin `accelerate launch` handed the process, before TrainingArguments is built from them: every route folded
    into `deepspeed` (or `fsdp` + `fsdp_config`) and the DeepSpeed and FSDP files checked. `parse_args` then reads the
    engine out of TrainingArguments once (`run_engine`)."""
    route = _resolve_ds_config(values)
    check_fsdp_config_file(values.get("fsdp_config"))
    return route


def run_engine(training, ds_config_path: str | None, route: EngineRoute = NO_ROUTE) -> Engine:
    """The engine TrainingArguments select, read out of them once (`parallel.engine.engine_of` takes the values):
    transformers' DeepSpeed config when a route set it (a path given to TrainingArguments directly is its own file
    name), else the FSDP plugin's arguments; `route`: how the user named it (`resolve_engine_values`)."""
    deepspeed = training.deepspeed
    if not deepspeed:
        return engine_of(fsdp_plugin_args=training.fsdp_plugin_args, route=route)
    path = deepspeed if isinstance(deepspeed, str) else ds_config_path
    return engine_of(training.hf_deepspeed_config, ds_config_path=path, route=route)


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
        parser.engine_route = resolve_engine_values(values)
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


def _parse(argv: list[str], extra_classes: tuple = ()) -> tuple[tuple, EngineRoute]:
    """(the dataclasses, the engine's route) from argv or from one .json/.yaml file (plus overrides after it); every
    route to an engine resolved into `deepspeed` (or `fsdp`) from the parsed values (`resolve_engine_values`).
    `extra_classes`: a recipe's own groups, after the shared ones."""
    parser = _CheckingParser((*ALL_ARGUMENT_CLASSES, *extra_classes))
    if argv and _is_args_file(argv[0]):
        return _parse_args_file(parser, argv[0], argv[1:]), parser.engine_route
    return _parse_flags(parser, argv), parser.engine_route


def parse_args(argv: list[str] | None = None, mae: bool = False) -> RecipeArguments:
    """Parse every argument group from argv (or one .json/.yaml file) and check them together, before anything
    loads. Field checks live in each dataclass's `__post_init__`; checks across groups are in `validate_args`.
    `mae`: recipes/pretrain_mae.py's flags too (`MaeArguments`), and its refusals (`check_mae_run`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    groups, route = _parse(argv, (MaeArguments,) if mae else ())
    args = RecipeArguments(*groups)
    # The one read of the engine: every later reader uses this object.
    args.run_engine = run_engine(args.training, args.engine.ds_config, route)
    keep_hub_token_out_of_arguments(args.training)
    if mae:
        check_mae_run(args)
    validate_args(args)
    check_restart_setup(args.training, os.environ)
    return args
