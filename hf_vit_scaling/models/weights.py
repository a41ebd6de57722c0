"""A checkpoint's tensors: reading them, converting their keys as `from_pretrained` does, loading every one strictly
and naming the keys in an error. Shared by fine-tuning (`presets`), resume and the best model
(`training.checkpoints`, `training.upstream`) and the EMA (`regularization.ema`)."""

import json
import os
import re

from hf_vit_scaling.errors import UserInputError

_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")  # the Trainer's checkpoint-N folders

SHOWN_KEYS = 3  # an error names this many keys of each kind, then says how many more


def read_state_dict(files: list[str]) -> dict:
    """Every tensor of `files` on the CPU (safetensors, or `weights_only` torch loading)."""
    import torch
    from safetensors.torch import load_file

    state_dict = {}
    for path in files:
        if path.endswith(".safetensors"):
            state_dict.update(load_file(path, device="cpu"))
        else:
            state_dict.update(torch.load(path, map_location="cpu", weights_only=True))
    return state_dict


def some_keys(keys) -> str:
    """The first SHOWN_KEYS of `keys` in sorted order, and how many more there are."""
    keys = sorted(keys)
    more = f" and {len(keys) - SHOWN_KEYS} more" if len(keys) > SHOWN_KEYS else ""
    return ", ".join(keys[:SHOWN_KEYS]) + more


def loading_problems(info: dict) -> str | None:
    """`from_pretrained(..., output_loading_info=True)`'s report as one phrase, or None when every tensor of the
    model came from the checkpoint and every checkpoint tensor went into the model (transformers only warns)."""
    kinds = (("missing", "missing_keys"), ("unexpected", "unexpected_keys"), ("of another shape", "mismatched_keys"))
    parts = []
    for words, key in kinds:
        keys = [k[0] if isinstance(k, tuple) else k for k in info.get(key) or ()]
        if keys:
            parts.append(f"{len(keys)} {words} ({some_keys(keys)})")
    return "; ".join(parts) or None


def from_pretrained_strictly(model_cls, path: str, error_cls, what: str, fix: str, **kwargs):
    """`model_cls.from_pretrained(path)`, every tensor or `error_cls` naming the keys: `from_pretrained` fills a
    tensor missing from the checkpoint with random values and only warns. A tensor of another shape is reported too
    (`ignore_mismatched_sizes=True` puts it in the loading info; without it transformers raises a bare RuntimeError
    that points at a printed table) and refused the same way, so the model is never used."""
    kwargs.setdefault("ignore_mismatched_sizes", True)
    model, info = model_cls.from_pretrained(path, output_loading_info=True, **kwargs)
    problem = loading_problems(info)
    if problem:
        raise error_cls(f"{what} {path!r} does not hold every tensor of its model: {problem}. Fix: {fix}")
    return model


def checkpoint_step(folder: str) -> int | None:
    """The step a `checkpoint-N` folder was saved at, or None for another name."""
    match = _CHECKPOINT_RE.match(os.path.basename(os.path.normpath(folder)))
    return int(match.group(1)) if match else None


def model_weight_files(folder: str) -> list[str]:
    """The files holding a checkpoint's model weights: model.safetensors, else pytorch_model.bin, each possibly
    sharded (its .index.json lists the shards); [] when there are none."""
    from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME

    for name in (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME):
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        if name.endswith(".index.json"):
            with open(path, encoding="utf-8") as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
            return [os.path.join(folder, shard) for shard in shards]
        return [path]
    return []


def converted_state_dict(model, state_dict: dict) -> dict:
    """`state_dict` under the names of `model`'s modules, through the conversion `from_pretrained` applies
    (`transformers.core_model_loading.convert_and_load_state_dict_in_model`): the model's registered renamings and
    converters (`conversion_mapping.get_model_conversion_mapping`), the base-model prefix added or dropped, and a key
    already in the model's format kept as it is, so converting twice changes nothing. Only the keys change (and a
    converter's tensors, e.g. a fused qkv split in three); nothing is loaded."""
    from copy import deepcopy

    from transformers import PreTrainedModel
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, dot_natural_key, rename_source_key

    if not isinstance(model, PreTrainedModel):
        return dict(state_dict)
    expected = model.state_dict()
    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    by_pattern = {pattern: c for c in converters for pattern in c.source_patterns}
    prefix = model.base_model_prefix
    converted, pending = {}, {}
    for key, tensor in sorted(state_dict.items(), key=lambda item: dot_natural_key(item[0])):  # a converter's order
        new_key, pattern = rename_source_key(key, renamings, converters, prefix, expected)
        if new_key not in expected and key in expected:  # already the model's name (as from_pretrained decides)
            new_key, pattern = rename_source_key(key, [], [], base_model_prefix=prefix, meta_state_dict=expected)
        if pattern is None or new_key not in expected:
            converted[new_key] = tensor
            continue
        converter = pending.setdefault(new_key, deepcopy(by_pattern[pattern]))
        converter.add_tensor(new_key, key, pattern, tensor)
    for first_key, converter in pending.items():
        for name, value in converter.convert(first_key, model=model, config=model.config).items():
            converted[name] = value[0] if isinstance(value, list) else value
    return converted


MODEL_WORDS = ("tensor(s) of the model missing", "tensor(s) the model does not have", "tensor(s) of another shape")


def shape_problems(expected: dict[str, tuple], loaded: dict, words: tuple[str, str, str] = MODEL_WORDS) -> str | None:
    """The one missing / extra / wrong-shape key report: None when `loaded` (name -> tensor) holds exactly the names of
    `expected` (name -> shape) with those shapes, else what differs, in one line: the first few keys of each kind,
    named by `words` (missing, not expected, of another shape)."""
    missing = set(expected) - set(loaded)
    unexpected = set(loaded) - set(expected)
    reshaped = {
        f"{key} {tuple(loaded[key].shape)} (expected {tuple(expected[key])})"
        for key in set(expected) & set(loaded)
        if tuple(loaded[key].shape) != tuple(expected[key])
    }
    found = zip(words, (missing, unexpected, reshaped))
    return "; ".join(f"{len(keys)} {what}: {some_keys(keys)}" for what, keys in found if keys) or None


def state_dict_problems(expected: dict, loaded: dict) -> str | None:
    """`shape_problems` of a model's state dict (name -> tensor) against a converted checkpoint's tensors."""
    return shape_problems({key: tuple(value.shape) for key, value in expected.items()}, loaded)


def load_model_weights(model, folder: str, error_cls=UserInputError, what: str = "", fix: str = "") -> int:
    """Load `folder`'s model weights into `model` (a plain module, not DeepSpeed or FSDP), converted as
    `from_pretrained` converts them, every tensor or none: otherwise `error_cls`, one line: `what` (e.g. the flag),
    `folder`, the keys, then `fix`. Returns the number of tensors loaded."""
    import torch

    where = f"{what} {folder}".strip()
    files = model_weight_files(folder)
    if not files:
        raise error_cls(f"{where} holds no model weights (model.safetensors or pytorch_model.bin). {fix}".strip())
    loaded = converted_state_dict(model, read_state_dict(files))
    problem = state_dict_problems(model.state_dict(), loaded)
    if problem:
        raise error_cls(f"{where} does not restore every tensor of the model: {problem}. {fix}".strip())
    with torch.no_grad():
        model.load_state_dict(loaded, strict=True)
    return len(loaded)
