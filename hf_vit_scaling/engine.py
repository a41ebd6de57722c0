"""Which training engine runs a recipe, and the setup it needs before the model is built.

One code path per engine, both through the Trainer:
- DeepSpeed ZeRO 0-3 (and offload): `--ds_config` resolved into `TrainingArguments.deepspeed`; the Trainer builds
  the DeepSpeed engine from that config, with every "auto" value filled from the flags.
- the plain Trainer: one process, or DDP when several processes are launched.
A further engine (FSDP2 through the Trainer's `--fsdp`/`--fsdp_config`) gets its own `kind` here, so the report,
the model card and the done line name it without the recipe changing.
"""

from dataclasses import dataclass
from typing import Any

from .deepspeed_config import offload_targets, zero_stage
from .distributed import init_deepspeed_comm


@dataclass(frozen=True)
class Engine:
    """The engine of this run: `kind` is "deepspeed" or "trainer" (plain Trainer: DDP with several processes)."""

    kind: str
    ds_config: dict[str, Any] | None = None  # the config TrainingArguments loaded, "auto" values filled
    ds_config_path: str | None = None

    @property
    def zero_stage(self) -> int | None:
        return zero_stage(self.ds_config)

    @property
    def offload(self) -> dict[str, str]:
        return offload_targets(self.ds_config)

    def label(self) -> str:
        """Short name for the done line: "ZeRO-2", or "no DeepSpeed" for the plain Trainer."""
        return f"ZeRO-{self.zero_stage}" if self.kind == "deepspeed" else "no DeepSpeed"


def engine_of(training_args) -> Engine:
    """The engine TrainingArguments select (parse_args already checked and loaded any DeepSpeed config)."""
    if not training_args.deepspeed:
        return Engine("trainer")
    path = training_args.deepspeed if isinstance(training_args.deepspeed, str) else None
    return Engine("deepspeed", training_args.hf_deepspeed_config.config, path)


def start_engine(engine: Engine) -> None:
    """What must exist before the model is built: ZeRO-3 builds it partitioned, so DeepSpeed must know the world."""
    if engine.kind == "deepspeed":
        init_deepspeed_comm()
