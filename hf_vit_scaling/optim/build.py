"""`Optimization`: the one builder of a run's optimizer and learning-rate schedule. `VitTrainer.create_optimizer`
and `create_scheduler` call it; the Trainer calls those for every engine (DeepSpeed takes the Trainer's optimizer
and schedule for every ZeRO stage when its config has no "optimizer" / "scheduler" block), so what is built here is
what every engine steps.

What it leaves to the Trainer, it returns as None: the optimizer of `--optim` with the Trainer's parameter groups
when there is no `--layer_decay`, the schedule of `--lr_scheduler_type` when the run names none of `SCHEDULES`.
"""

from dataclasses import dataclass, field

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.optim.layer_decay import LayerDecayReport, layer_decay_optimizer_cls_and_kwargs
from hf_vit_scaling.optim.lr_scaling import lr_for_global_batch
from hf_vit_scaling.optim.schedules import SCHEDULES


@dataclass
class Optimization:
    """The run's optimization settings, built once from the flags (`training.run.prepare_world`: the learning-rate
    group `--lr_scaling`, `--reference_batch_size`, and `--layer_decay`; a flag added to that group arrives here by
    its name): `lr_scaling` and `reference_batch_size` (the lr for the global batch), `layer_decay` (BEiT's per-layer
    lrs, or None) and `lr_schedule` (a name of `SCHEDULES`, or None for the Trainer's `--lr_scheduler_type`).
    `report`: with layer decay, the callback that writes the groups the optimizer holds
    (output_dir/layer_decay_groups.json); the Trainer attaches it."""

    lr_scaling: str = "none"
    reference_batch_size: int = 256
    layer_decay: float | None = None
    lr_schedule: str | None = None
    report: LayerDecayReport | None = field(init=False, default=None)

    def __post_init__(self):
        if self.lr_schedule is not None and self.lr_schedule not in SCHEDULES:
            raise UserInputError(
                f"learning-rate schedule {self.lr_schedule!r}: the project has "
                f"{', '.join(SCHEDULES) or 'none'}. Fix: name one of them."
            )
        if self.layer_decay is not None:
            self.report = LayerDecayReport()

    def scale_learning_rate(
        self,
        learning_rate: float,
        warmup_steps: float,
        per_device_batch: int,
        accumulation: int,
        world_size: int,
        sequence_parallel_size: int = 1,
    ) -> dict:
        """The learning rate and warmup for the run's global batch (`lr_scaling.lr_for_global_batch`, before the
        Trainer exists: the caller gives the Trainer "lr" and "warmup_steps"); the rule applied, for the card and the
        log."""
        return lr_for_global_batch(
            learning_rate,
            warmup_steps,
            per_device_batch,
            accumulation,
            world_size,
            self.lr_scaling,
            self.reference_batch_size,
            sequence_parallel_size,
        )

    def optimizer_cls_and_kwargs(self, trainer, model) -> tuple[type, dict] | None:
        """The optimizer class and its arguments for `trainer.optimizer_cls_and_kwargs` (the Trainer's
        `create_optimizer` builds it), or None for the Trainer's own."""
        if self.layer_decay is None:
            return None
        optimizer_cls, kwargs = layer_decay_optimizer_cls_and_kwargs(trainer, model, self.layer_decay)
        self.report.record(model, kwargs["params"])
        return optimizer_cls, kwargs

    def scheduler(self, optimizer, num_training_steps: int, num_warmup_steps: int, scheduler_kwargs: dict | None):
        """The schedule named for the run, with the Trainer's warmup (in steps) and `--lr_scheduler_kwargs`, or None
        for the Trainer's own (`--lr_scheduler_type`)."""
        if self.lr_schedule is None:
            return None
        return SCHEDULES[self.lr_schedule](
            optimizer,
            num_warmup_steps=num_warmup_steps,
            num_training_steps=num_training_steps,
            **(scheduler_kwargs or {}),
        )
