"""Reading and checking DeepSpeed JSON configs before any expensive work starts."""

import json
import os
from typing import Any

from hf_vit_scaling.errors import UserInputError

ZERO_STAGES = (0, 1, 2, 3)


def load_ds_config(path: str, flag: str = "--ds_config") -> dict[str, Any]:
    """Load a DeepSpeed JSON config and check what we rely on: it is a JSON object with a known ZeRO stage."""
    if not os.path.isfile(path):
        raise UserInputError(
            f"{flag} {path!r}: no such file. Fix: pass one of the files in ds_configs/ (e.g. ds_configs/zero2.json)."
        )
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserInputError(
            f"{flag} {path!r} is not valid JSON ({err}). Fix the file or pick one in ds_configs/."
        ) from err
    if not isinstance(config, dict):
        raise UserInputError(
            f"{flag} {path!r} must hold a JSON object (a dict of DeepSpeed keys), not {type(config).__name__}."
        )
    stage = config.get("zero_optimization", {}).get("stage", 0)
    if stage not in ZERO_STAGES:
        raise UserInputError(
            f"{flag} {path!r}: zero_optimization.stage is {stage!r}; DeepSpeed knows stages 0, 1, 2 and 3. "
            "Fix the stage."
        )
    return config


def zero_stage(config: dict[str, Any] | None) -> int | None:
    """ZeRO stage of a loaded config, or None when DeepSpeed is not used."""
    if config is None:
        return None
    return int(config.get("zero_optimization", {}).get("stage", 0))


def offload_targets(config: dict[str, Any] | None) -> dict[str, str]:
    """Which states a config offloads and where, e.g. {"optimizer": "cpu", "param": "cpu"}."""
    zero = (config or {}).get("zero_optimization", {})
    targets = {}
    for state in ("optimizer", "param"):
        device = zero.get(f"offload_{state}", {}).get("device", "none")
        if device not in (None, "none"):
            targets[state] = device
    return targets


def check_ds_config_against_flags(mismatches) -> None:
    """A ds_config that hard-codes batch size, accumulation, clipping or lr differently from the flags: name every
    key now (transformers would only raise once the Trainer is built, after data and model are loaded).
    `mismatches`: the engine's `ds_config_mismatches` ("train_batch_size=8 vs hf ...")."""
    if mismatches:
        raise UserInputError(
            "--ds_config values conflict with the command-line flags: "
            + "; ".join(mismatches)
            + '. Fix: set these keys to "auto" in the config (the Trainer fills them) or change the flags.'
        )
