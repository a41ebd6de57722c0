"""Reading and checking DeepSpeed JSON configs before any expensive work starts: the file loaded and checked once
(`load_ds_config`), the values the project reads from it read once (`read_config`, when the run's `Engine` is made),
and the values sized from the model (`model_sized_values`, which `Engine.resolve_for_model` writes)."""

import json
import os
from dataclasses import dataclass, field
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
    check_zero_values(config.get("zero_optimization", {}), path, flag)
    return config


def check_zero_values(zero: dict[str, Any], path: str, flag: str) -> None:
    """The `zero_optimization` section read by DeepSpeed's own model (`DeepSpeedZeroConfig`, pydantic) now, its
    "auto" values left out (the Trainer and the project fill them): a bad value (a negative bucket size) is one line
    naming the key, not a traceback from every launched rank once the Trainer builds the engine."""
    import pydantic
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    written = {key: value for key, value in zero.items() if value != "auto"}
    try:
        DeepSpeedZeroConfig(**written)
    except pydantic.ValidationError as err:
        first = err.errors()[0]
        key = ".".join(str(part) for part in first["loc"])
        raise UserInputError(
            f"{flag} {path!r}: zero_optimization.{key} = {first.get('input')!r}: {first['msg']}. Fix the value, or "
            'set it to "auto" (the project sizes buckets from the model).'
        ) from err


@dataclass(frozen=True)
class ConfigReading:
    """What the project reads from the run's DeepSpeed dict, read once (`read_config`) when the run's `Engine` is made:
    nothing the project writes into the dict afterwards (the scaled lr, sequence parallelism's batch, universal
    loading, the model-sized values) changes any of it, so every later check and choice reads these values, not the
    dict. The default is the reading of no config (no DeepSpeed)."""

    zero_stage: int | None = None
    offload: dict[str, str] = field(default_factory=dict)  # which states are offloaded where: {"optimizer": "cpu"}
    own_sections: tuple[str, ...] = ()  # "optimizer", "scheduler": what DeepSpeed builds itself instead of the Trainer
    lr_keys: tuple[str, ...] = ()  # the dotted keys of those sections that carry the learning rate
    zero_written: frozenset[str] = frozenset()  # zero_optimization keys the user gave a value (not "auto")
    timers_written: bool = False  # the config has a `timers` section of its own
    # Gradient buckets reduced by reduce-scatter: False with reduce_scatter false while gradients are contiguous, the
    # path on which DeepSpeed averages some buckets over a sequence-parallel group and sums others.
    reduce_scatter: bool = True


NO_DEEPSPEED = ConfigReading()


def read_config(config: dict[str, Any] | None) -> ConfigReading:
    """The `ConfigReading` of a loaded DeepSpeed dict (None: no DeepSpeed)."""
    if config is None:
        return NO_DEEPSPEED
    zero = config.get("zero_optimization", {})
    devices = {state: zero.get(f"offload_{state}", {}).get("device", "none") for state in ("optimizer", "param")}
    own = tuple(section for section in ("optimizer", "scheduler") if section in config)
    lr_keys = tuple(
        f"{section}.params.{key}"
        for section, key in (("optimizer", "lr"), ("scheduler", "warmup_max_lr"))
        if key in config.get(section, {}).get("params", {})
    )
    return ConfigReading(
        zero_stage=int(zero.get("stage", 0)),
        offload={state: device for state, device in devices.items() if device not in (None, "none")},
        own_sections=own,
        lr_keys=lr_keys,
        zero_written=frozenset(key for key, value in zero.items() if value != "auto"),  # a number always wins
        timers_written="timers" in config,
        reduce_scatter=not (
            zero.get("reduce_scatter", True) is False and zero.get("contiguous_gradients", True) is not False
        ),
    )


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


# --------------------------------------------------------------------------- the run's values, resolved once

BUCKET_ALIGNMENT = 512  # elements; DeepSpeed asserts bucket sizes are multiples of its start alignment (2 on CPU)
DEEPSPEED_DEFAULT_BUCKET = 500_000_000  # DeepSpeed's own default (runtime/zero/config.py): the cap used here too
FLUSHES_ON_SEVERAL_PROCESSES = 4  # gradient buckets per step when there is communication to overlap with backward


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def gradient_bucket_elements(tensor_numels: list[int], world_size: int, overlap: bool = True) -> tuple[int, int]:
    """(bucket elements, flushes a step at most) for a model's gradient tensors.

    DeepSpeed fills a bucket with whole gradients as backward produces them and flushes it (a flatten, a collective,
    a copy back; on a GPU with stream waits) when the next gradient would not fit. transformers' "auto" is
    hidden_size^2 (589,824 for ViT-B, about one 768x768 matrix): 147 flushes a step over ViT-B/16's 200 tensors.
    With nothing to overlap (one process, or a CPU, where DeepSpeed reduces a bucket before the backward goes on:
    `overlap` False) one bucket holds every gradient: one flush, in the epilogue. With several GPUs, F = 4 flushes
    overlap the reduction with the backward still running. Every bucket but the last holds more than
    B - m (m: the largest gradient), so n buckets need (n - 1)(B - m) < total; n <= F holds for
    B = ceil(total / (F - 1)) + m. ViT-B/16: 85,806,346 / 3 + 2,359,296 = 30,961,412 -> 30,961,664 elements
    (x 2 bytes = 59 MiB in bf16, against 5e8 x 2 bytes = 0.93 GiB for DeepSpeed's default), capped at that default
    for larger models."""
    total, largest = sum(tensor_numels), max(tensor_numels)
    flushes = FLUSHES_ON_SEVERAL_PROCESSES if overlap and world_size > 1 else 1
    bucket = total if flushes == 1 else -(-total // (flushes - 1)) + largest
    return min(_round_up(bucket, BUCKET_ALIGNMENT), DEEPSPEED_DEFAULT_BUCKET), flushes


def bucket_flushes(numels_in_backward_order: list[int], bucket: int) -> int:
    """Flushes a step under DeepSpeed's bucket rule (`reduce_independent_p_g_buckets_and_remove_grads`): flush when
    the next gradient would not fit, and once more in the backward's epilogue for what is left."""
    flushes, filled = 0, 0
    for numel in numels_in_backward_order:
        if filled + numel > bucket:
            flushes, filled = flushes + 1, 0
        filled += numel
    return flushes + (filled > 0)


# DeepSpeed's own default `stage3_param_persistence_threshold` (`DeepSpeedZeroConfig.param_persistence_threshold`,
# deepspeed/runtime/zero/config.py): a tensor of at most this many elements is never partitioned, its gather being a
# latency-bound message. transformers' "auto" writes 10 x hidden instead (960 for the tiny preset), a rule for LMs.
DEEPSPEED_PERSISTENCE_THRESHOLD = 100_000


def zero3_keeps_every_tensor_whole(world_size: int, offload: dict[str, str]) -> bool:
    """Whether the resolved ZeRO-3 persistence keeps every tensor whole whatever their sizes: on one process (a
    partition over one rank is the whole tensor) unless the weights are offloaded (DeepSpeed keeps a persistent tensor
    on the device, partition_parameters.py: `if param.ds_persist: device = self.local_device`)."""
    return world_size <= 1 and "param" not in offload


def zero3_persistence_threshold(
    tensor_numels: list[int], small_tensor_max: int, world_size: int, offload: dict[str, str]
) -> tuple[int, str]:
    """The resolved `stage3_param_persistence_threshold` and its reason (DeepSpeed keeps a tensor whole when its
    element count is at most the threshold, `mark_persistent_parameters`): one above the largest tensor where
    `zero3_keeps_every_tensor_whole`; else DeepSpeed's own default, raised to one above the largest tensor that is not
    a weight matrix (biases, LayerNorms) so that no such tensor pays a gather. ViT-B/16 on 2+ GPUs: 100,000 (its
    1-D tensors have at most 3,072 elements), every 768 x 768 and larger matrix partitioned; the tiny preset's largest
    tensor has 18,432 elements, so all of it stays whole. The planner reads the same threshold."""
    if zero3_keeps_every_tensor_whole(world_size, offload):
        return max(tensor_numels) + 1, "one process: nothing to shard over, every tensor kept whole (no gathers)"
    threshold = max(DEEPSPEED_PERSISTENCE_THRESHOLD, small_tensor_max + 1)
    if max(tensor_numels) <= threshold:
        return threshold, f"DeepSpeed's default {threshold:,}: every tensor is smaller, all kept whole (no gathers)"
    return threshold, f"DeepSpeed's default {threshold:,}: larger weight matrices partitioned, the rest kept whole"


def model_sized_values(
    config: ConfigReading,
    tensor_numels: list[int],
    small_tensor_max: int,
    world_size: int,
    layer_class: str | None,
    on_gpu: bool = True,
    frozen_tensor_max: int = 0,
) -> dict[str, tuple[Any, str]]:
    """The values of a DeepSpeed config (its `ConfigReading`) that depend on the model, chosen from its real tensors:
    {dotted key: (value, reason)}. Only keys the user left out or set to "auto" are chosen; a number in the file
    always wins.

    - gradient buckets (`reduce_bucket_size`; ZeRO-1/2 `allgather_bucket_size`; ZeRO-3 `stage3_prefetch_bucket_size`):
      `gradient_bucket_elements`;
    - ZeRO-3 `stage3_param_persistence_threshold`: `zero3_persistence_threshold`, DeepSpeed's own default (1e5
      elements) raised above the largest tensor that is not a weight matrix, so ViT-B's matrices are partitioned
      (that is ZeRO-3's memory) and nothing small pays a latency-bound gather (transformers' 10 x hidden is meant for
      LMs); on one process one above the largest tensor: a partition over one rank is the whole tensor, so a gather
      only adds a copy, hooks and a transient buffer (measured: benchmarks/README.md, "Engine overhead"), unless the
      weights are offloaded (`offload_param`): DeepSpeed keeps a persistent tensor on the device, so "whole" would
      undo the offload;
    - ZeRO-3 `leaf_module`: the encoder layer (`layer_class`), gathered whole on entry: one hook and one gather per
      layer instead of one per submodule (18 a ViT layer; DeepSpeed's `set_z3_leaf_modules`);
    - ZeRO-2/3 `overlap_comm` and `contiguous_gradients` (left out of the shipped configs: accelerate refuses
      "auto" for them in a plain Trainer script that copies a config): on where there is
      something to overlap, several processes on GPUs (the reduction runs on a side stream while the backward goes
      on); off on one process or on a CPU (no streams: the overlap machinery and the copy of every gradient into the
      bucket are per-gradient host work that buys nothing there). ZeRO-1 gets the same "off" there (DeepSpeed's
      default contiguous_gradients adds a hook and a copy per gradient) and keeps DeepSpeed's defaults on several
      GPUs;
    - ZeRO-3 `memory_efficient_linear`: off where every tensor is kept whole (the threshold above is resolved and no
      tensor is larger): DeepSpeed's linear (`zero.Init` puts it in place of `torch.nn.functional.linear` for the
      whole process) re-fetches a released weight in the backward, and a weight kept whole is never released, so it
      only adds an autograd Function per linear call (measured: benchmarks/README.md, "Engine overhead");
      `Engine.resolve_for_model` puts torch's linear back. Partitioned weights keep DeepSpeed's default (on);
    - `timers.throughput`: off. DeepSpeed's throughput timer synchronizes the device at the start of forward and in
      `step()` when the engine got no dataloader (under the Trainer); the throughput report times steps itself.
    `tensor_numels`: every trainable tensor's full element count (ZeRO-3: `ds_numel`); `small_tensor_max`: the
    largest one with fewer than 2 dimensions; `frozen_tensor_max`: the largest parameter that is not trained."""
    stage, written = config.zero_stage or 0, config.zero_written
    values: dict[str, tuple[Any, str]] = {}
    overlap = on_gpu and world_size > 1  # a side stream, and another rank's reduction to run on it
    if stage >= 1:
        bucket, flushes = gradient_bucket_elements(tensor_numels, world_size, overlap=overlap)
        plural = "es" if flushes > 1 else ""
        why = (
            f"{flushes} gradient flush{plural} a step at most for {sum(tensor_numels):,} elements in "
            f"{len(tensor_numels)} tensors on {world_size} process{'es' if world_size > 1 else ''}"
            + (" of a CPU (nothing to overlap)" if world_size > 1 and not overlap else "")
        )
        keys = ["reduce_bucket_size", "stage3_prefetch_bucket_size" if stage == 3 else "allgather_bucket_size"]
        for key in keys:
            if key not in written:
                values[f"zero_optimization.{key}"] = (bucket, why)
    if stage >= 2 or (stage == 1 and not overlap):
        why = (
            "overlaps the reduction with the backward" if overlap else "nothing to overlap with (one process or a CPU)"
        )
        for key in ("overlap_comm", "contiguous_gradients"):
            if key not in written:
                values[f"zero_optimization.{key}"] = (overlap, why)
    if stage == 3 and "stage3_param_persistence_threshold" not in written:
        threshold, why = zero3_persistence_threshold(tensor_numels, small_tensor_max, world_size, config.offload)
        values["zero_optimization.stage3_param_persistence_threshold"] = (threshold, why)
        whole = max(max(tensor_numels), frozen_tensor_max) <= threshold  # a frozen weight is partitioned too
        if whole and not {"memory_efficient_linear", "stage3_model_persistence_threshold"} & written:
            why = "every tensor kept whole: torch's own linear, no weight to re-fetch in the backward"
            values["zero_optimization.memory_efficient_linear"] = (False, why)
    if stage == 3 and layer_class and "leaf_module" not in written:
        values["zero_optimization.leaf_module"] = ({"classes": [layer_class]}, "each encoder layer gathered whole")
    if not config.timers_written:
        values["timers"] = ({"throughput": {"enabled": False}}, "DeepSpeed's timer syncs the device every step")
    return values
