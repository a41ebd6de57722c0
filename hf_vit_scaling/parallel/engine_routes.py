"""Every route by which a user names an engine, read into the one pair of values the Trainer builds it from.

The routes: the recipe's `--ds_config`, the Trainer's `--deepspeed`, accelerate's DeepSpeed plugin (`accelerate
launch --config_file` with `distributed_type: DEEPSPEED`, naming a `deepspeed_config_file` or giving accelerate's own
`zero_stage`/offload/clipping fields; or `accelerate launch --use_deepspeed --zero_stage N`), accelerate's FSDP
plugin (`distributed_type: FSDP`, `--use_fsdp --fsdp_version 2`), and `--fsdp --fsdp_config`. `accelerate launch`
hands its plugin to the script as environment variables only (accelerate/utils/launch.py,
`prepare_deepspeed_cmd_env` and `prepare_multi_gpu_env`), which transformers reads only when
`TrainingArguments.deepspeed` is unset: the plain Trainer then asks accelerate's `DeepSpeedPlugin()` for a config
late, inside the Trainer, and the project never sees it. Here each route becomes `TrainingArguments.deepspeed` (a
dict) or `--fsdp` with an `fsdp_config` dict before TrainingArguments is built, so the Engine, the model-sized values,
the fast paths, the reports and the card are the same whichever route the user took.

accelerate's own code translates its DeepSpeed flags (`DeepSpeedPlugin()` builds the dict from its variables); its
FSDP variables map one to one onto transformers' `fsdp_config` keys (`FSDP_ENV_TO_CONFIG`), which transformers then
hands back to accelerate's `FullyShardedDataParallelPlugin`.
"""

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hf_vit_scaling.errors import UserInputError

TRANSFORMER_WRAP = "TRANSFORMER_BASED_WRAP"  # accelerate's default auto_wrap_policy

# The keys the Trainer owns (transformers' `HfTrainerDeepSpeedConfig.trainer_config_process` fills them from the
# flags when they are "auto"). A config that leaves one out gets "auto": DeepSpeed itself would stop on a missing
# batch size (`_set_batch_related_parameters`) and silently use its own clipping and precision for the rest.
TRAINER_OWNED_KEYS = (
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "gradient_clipping",
    "bf16.enabled",
    "fp16.enabled",
)

# accelerate's FSDP launch variables -> transformers' fsdp_config keys (TrainingArguments._process_fsdp_args).
FSDP_ENV_TO_CONFIG = {
    "FSDP_VERSION": "version",
    "FSDP_RESHARD_AFTER_FORWARD": "reshard_after_forward",
    "FSDP_OFFLOAD_PARAMS": "cpu_offload",
    "FSDP_STATE_DICT_TYPE": "state_dict_type",
    "FSDP_AUTO_WRAP_POLICY": "auto_wrap_policy",
    "FSDP_TRANSFORMER_CLS_TO_WRAP": "transformer_layer_cls_to_wrap",
    "FSDP_MIN_NUM_PARAMS": "min_num_params",
    "FSDP_ACTIVATION_CHECKPOINTING": "activation_checkpointing",
    "FSDP_CPU_RAM_EFFICIENT_LOADING": "cpu_ram_efficient_loading",
    "FSDP_SYNC_MODULE_STATES": "sync_module_states",
}


# What the recipe needs of a ZeRO-3 config that leaves it out: DeepSpeed's default (false) saves no model.safetensors,
# only the partitioned state, so there would be no model to evaluate, card or push (a `false` in the file stands).
ZERO3_LEFT_OUT = {"zero_optimization.stage3_gather_16bit_weights_on_model_save": True}


@dataclass(frozen=True)
class EngineRoute:
    """How the run's engine was named (`route`, for the report, the card and the done line), and the keys the
    DeepSpeed config left out that were filled (`filled`: (dotted key, reason)): the Trainer-owned ones with "auto",
    ZeRO-3's model save with true."""

    route: str = "no engine flag (plain Trainer)"
    filled: tuple[tuple[str, str], ...] = ()


NO_ROUTE = EngineRoute()  # no engine named: the plain Trainer


def _true(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name, "false").strip().lower() in ("1", "true", "yes")


def accelerate_deepspeed(environ: Mapping[str, str]) -> tuple[str | dict, str] | None:
    """(the DeepSpeed config file or dict, the route in words) that `accelerate launch` handed this process, or None
    when it launched no DeepSpeed. A config file is returned as its path (the caller loads and checks it as it
    does `--ds_config`); accelerate's own fields become the dict accelerate's `DeepSpeedPlugin` builds from them."""
    if not _true(environ, "ACCELERATE_USE_DEEPSPEED"):
        return None
    path = environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "none")
    if path and path != "none":
        stage = environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE")
        return path, f"accelerate's deepspeed_config_file {path}" + (f" (zero_stage {stage})" if stage else "")
    from accelerate.utils import DeepSpeedPlugin

    plugin = DeepSpeedPlugin()  # reads the same variables the Trainer's late plugin would
    config = dict(plugin.deepspeed_config)
    # accelerate's "never print" (float inf) is no JSON number: the card and checkpoints write the config out.
    config["steps_per_print"] = 10**9
    zero = config.get("zero_optimization", {})
    words = [f"zero_stage {zero.get('stage')}"]
    for state in ("optimizer", "param"):
        device = zero.get(f"offload_{state}", {}).get("device", "none")
        if device not in (None, "none"):
            words.append(f"offload_{state}_device {device}")
    return config, f"accelerate's DeepSpeed plugin ({', '.join(words)})"


def accelerate_fsdp(environ: Mapping[str, str]) -> dict[str, Any] | None:
    """transformers' `fsdp_config` from the FSDP plugin `accelerate launch` handed this process, or None."""
    if not _true(environ, "ACCELERATE_USE_FSDP"):
        return None
    config: dict[str, Any] = {}
    for variable, key in FSDP_ENV_TO_CONFIG.items():
        value = environ.get(variable)
        if value is None or value == "":
            continue
        if value.lower() in ("true", "false"):
            config[key] = value.lower() == "true"
        elif value.isdigit():
            config[key] = int(value)
        else:
            config[key] = value.split(",") if key == "transformer_layer_cls_to_wrap" else value
    by_layer = config.get("auto_wrap_policy", TRANSFORMER_WRAP) == TRANSFORMER_WRAP
    if by_layer and "transformer_layer_cls_to_wrap" not in config:
        # accelerate then wraps every class in the model's `_no_split_modules` (ViTEmbeddings too), which stops in
        # torch's fully_shard (`Invariant encountered: value was None`); fsdp_configs/ name the layer.
        raise UserInputError(
            "accelerate's FSDP plugin names no layer to wrap (fsdp_transformer_layer_cls_to_wrap). Fix: add "
            "--fsdp_transformer_layer_cls_to_wrap ViTLayer to accelerate launch (fsdp_transformer_layer_cls_to_wrap: "
            "ViTLayer in its config; DeiTLayer for DeiT), or run --fsdp --fsdp_config fsdp_configs/fsdp2.json."
        )
    return config


def section_of(config: dict[str, Any], dotted: str, create: bool = False) -> tuple[dict[str, Any], str]:
    """(the section of `config` that holds the dotted key "zero_optimization.stage", its last name): the sections
    made on the way with `create`, else an empty one where a section is missing."""
    *sections, key = dotted.split(".")
    node = config
    for section in sections:
        node = node.setdefault(section, {}) if create else node.get(section, {})
    return node, key


def fill_left_out_keys(config: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """Put "auto" into `config` for every Trainer-owned key it leaves out (`TRAINER_OWNED_KEYS`), and ZeRO-3's model
    save (`ZERO3_LEFT_OUT`); the filled keys with their reasons."""
    left_out = dict.fromkeys(TRAINER_OWNED_KEYS, "auto")
    if config.get("zero_optimization", {}).get("stage") == 3:
        left_out |= ZERO3_LEFT_OUT
    filled = []
    for dotted, value in left_out.items():
        node, key = section_of(config, dotted, create=True)
        if key not in node:
            node[key] = value
            why = "the Trainer's value" if value == "auto" else "the recipe saves model.safetensors (DeepSpeed: false)"
            filled.append((dotted, f"left out of the config: {why}"))
    return tuple(filled)


def same_file(a: str, b: str) -> bool:
    return os.path.abspath(a) == os.path.abspath(b)


def refuse_two_engines(flags: str | None, accelerate: str | None) -> None:
    """One error when the script's flags and accelerate's launch name engines that disagree."""
    if flags and accelerate:
        raise UserInputError(
            f"{flags} and {accelerate} name two engines. Fix: name the engine once, in the script's flags or in "
            "accelerate's config (then launch with `accelerate launch --config_file` and no engine flag)."
        )


def refuse_other_deepspeed(path: str, config: dict[str, Any], accelerate_source, accelerate_route: str) -> None:
    """The script's DeepSpeed file beside accelerate's DeepSpeed plugin: one error unless both name the same file,
    or accelerate's own fields ask for the file's stage."""
    if isinstance(accelerate_source, str):
        if not same_file(accelerate_source, path):
            raise UserInputError(
                f"{path!r} (the script's flag) and {accelerate_route} name two DeepSpeed configs. Fix: name one of "
                "them (drop the flag, or the deepspeed_config_file from accelerate's config)."
            )
        return
    stage = accelerate_source.get("zero_optimization", {}).get("stage")
    written = config.get("zero_optimization", {}).get("stage", 0)
    if stage != written:
        raise UserInputError(
            f"{path!r} (the script's flag) has zero_optimization.stage {written} and {accelerate_route} asks for "
            f"stage {stage}. Fix: name the engine once (drop the flag, or accelerate's --use_deepspeed/zero_stage)."
        )


def refuse_other_stage(path: str, config: dict[str, Any], accelerate_route: str, environ: Mapping[str, str]):
    """accelerate's `zero_stage` beside a config file whose stage differs: one error naming both."""
    stage = environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE")
    written = config.get("zero_optimization", {}).get("stage", 0)
    if stage is not None and stage.isdigit() and int(stage) != written:
        raise UserInputError(
            f"{path!r} has zero_optimization.stage {written} and {accelerate_route} asks for zero_stage {stage}. "
            "Fix: drop accelerate's zero_stage (the file says the stage) or make them agree."
        )
