"""Which training engine runs a recipe, and the setup it needs before the model is built.

One code path per engine, all through the Trainer:
- DeepSpeed ZeRO 0-3 (and offload): `--ds_config` resolved into `TrainingArguments.deepspeed`; the Trainer builds
  the DeepSpeed engine from that config, with every "auto" value filled from the flags.
- FSDP2: the Trainer's own `--fsdp --fsdp_config fsdp_configs/fsdp2.json` (TrainingArguments.fsdp_plugin_args ->
  accelerate's FullyShardedDataParallelPlugin -> torch's `fully_shard` on every `ViTLayer` and the root).
- the plain Trainer: one process, or DDP when several processes are launched.

`engine_of` is the one place that reads the engine out of TrainingArguments; `parse_args` calls it once, and every
later reader (the checks, the world's setup, the learning-rate scaling, the resume, the reports) uses that `Engine`.
Its `ds_config` is the very dict the Trainer builds DeepSpeed from, so a value set there (the scaled lr, universal
loading) reaches DeepSpeed.
"""

from dataclasses import dataclass, field
from typing import Any

from hf_vit_scaling.parallel.deepspeed_config import offload_targets, zero_stage
from hf_vit_scaling.parallel.distributed import init_deepspeed_comm


@dataclass(frozen=True)
class Engine:
    """The engine of this run: `kind` is "deepspeed", "fsdp" or "trainer" (plain Trainer: DDP with several
    processes)."""

    kind: str
    ds_config: dict[str, Any] | None = None  # the config TrainingArguments loaded, "auto" values filled
    ds_config_path: str | None = None
    fsdp_plugin_args: dict[str, Any] = field(default_factory=dict)  # TrainingArguments.fsdp_plugin_args
    ds_config_mismatches: tuple[str, ...] = ()  # config values that contradict the flags (transformers' list)

    @property
    def zero_stage(self) -> int | None:
        return zero_stage(self.ds_config)

    @property
    def offload(self) -> dict[str, str]:
        if self.kind == "fsdp":
            return {"optimizer": "cpu", "param": "cpu"} if self.fsdp_cpu_offload else {}  # CPUOffloadPolicy: both
        return offload_targets(self.ds_config)

    @property
    def fsdp_cpu_offload(self) -> bool:
        return bool(self.fsdp_plugin_args.get("cpu_offload"))

    def label(self) -> str:
        """Short name for the done line and the reports: "ZeRO-2", "FSDP2", or "no DeepSpeed" (plain Trainer)."""
        if self.kind == "deepspeed":
            return f"ZeRO-{self.zero_stage}"
        if self.kind == "fsdp":
            return "FSDP2" + (" + CPU offload" if self.fsdp_cpu_offload else "")
        return "no DeepSpeed"

    def describe(self) -> str:
        """What the model card's engine row says trained the model (its ds_config row names the file)."""
        if self.kind == "deepspeed":
            offload = ", ".join(f"{state} to {device}" for state, device in self.offload.items())
            return f"DeepSpeed {self.label()}" + (f" (offload: {offload})" if offload else "")
        if self.kind == "fsdp":
            args = self.fsdp_plugin_args
            resharded = "resharded after forward" if args.get("reshard_after_forward", True) else "kept after forward"
            return f"{self.label()} (fully_shard per ViTLayer, parameters {resharded}, {args.get('state_dict_type')})"
        return "none (plain Trainer)"


def engine_of(training_args) -> Engine:
    """The engine TrainingArguments select, read once (parse_args already checked and loaded any DeepSpeed/FSDP
    config): the DeepSpeed dict the Trainer will use, not a copy."""
    if training_args.deepspeed:
        path = training_args.deepspeed if isinstance(training_args.deepspeed, str) else None
        hf_config = training_args.hf_deepspeed_config
        mismatches = tuple(m.strip("- ").strip() for m in getattr(hf_config, "mismatches", []))
        return Engine("deepspeed", hf_config.config, path, ds_config_mismatches=mismatches)
    if training_args.fsdp_plugin_args:
        return Engine("fsdp", fsdp_plugin_args=dict(training_args.fsdp_plugin_args))
    return Engine("trainer")


def start_engine(engine: Engine, training_args) -> None:
    """What must exist before the model is built: ZeRO-3 builds it partitioned, so DeepSpeed must know the world;
    FSDP2 on a CPU world needs accelerate told (see `select_fsdp_on_cpu`)."""
    if engine.kind == "deepspeed":
        init_deepspeed_comm()
    elif engine.kind == "fsdp" and training_args.device.type == "cpu":
        select_fsdp_on_cpu(engine.fsdp_plugin_args, training_args.mixed_precision)


def select_fsdp_on_cpu(fsdp_plugin_args: dict, mixed_precision: str) -> None:
    """Make accelerate run FSDP2 on a CPU (gloo) world, as it does on GPUs.

    accelerate 1.15 turns FSDP on only for accelerator worlds: `AcceleratorState.__init__` checks the FSDP plugin
    inside `elif distributed_type in [MULTI_GPU, MULTI_XPU, ...]`, which leaves out MULTI_CPU, so on a CPU the Trainer
    trains plain DDP while `--fsdp` is set (measured: `DistributedDataParallel` wraps the model). torch's FSDP2
    (`fully_shard`) itself runs on CPU over gloo. So we do what that branch does, once, before the Trainer: build the
    shared state with the plugin (the mixed precision the Trainer will ask for) and mark it FSDP, in AcceleratorState
    and in PartialState as accelerate does at the end of `AcceleratorState.__init__`. The Trainer's Accelerator then
    finds the state set up, and everything after (fully_shard, optimizer re-binding, sharded saves) is accelerate's
    and transformers' own FSDP2 code. On GPUs this function is not called.
    """
    from accelerate import Accelerator
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(**fsdp_plugin_args)
    state = Accelerator(mixed_precision=mixed_precision, fsdp_plugin=plugin).state
    if state.distributed_type == DistributedType.FSDP:
        return  # accelerate selected it itself (a newer version)
    if mixed_precision != "no":
        plugin.set_mixed_precision(mixed_precision)
    state.fsdp_plugin = plugin
    state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
