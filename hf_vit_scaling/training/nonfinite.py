"""`NonFiniteLossPolicy`: what a NaN/inf training loss on any rank does (`--on_nonfinite_loss`)."""

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from hf_vit_scaling.errors import NonFiniteLossError
from hf_vit_scaling.log import logger
from hf_vit_scaling.parallel.distributed import is_multi_process
from hf_vit_scaling.training.checkpoints import newest_complete_checkpoint

NONFINITE_POLICIES = ("stop", "skip")


class NonFiniteLossPolicy(TrainerCallback):
    """What a NaN/inf training loss on any rank does. The ranks agree through one all-reduce of a flag per
    micro-step (MAX, on the device), so every rank takes the same decision at the same step.

    - "stop": raise `NonFiniteLossError` naming the first such step and the newest complete checkpoint. The flag,
      the step and the loss stay on the device and are read once, when the Trainer is about to log, save, evaluate
      or stop (`on_step_end`, `on_epoch_end`, `on_train_end`): no host read on the other steps, and no non-finite
      loss is logged nor any weights saved after one;
    - "skip": leave that optimizer step out on every rank. The decision is needed before the backward (under
      DeepSpeed the backward, and with it DeepSpeed's optimizer step and lr schedule, is not run; under the plain
      Trainer the backward runs, as DDP needs every rank in it, and the gradients are dropped, so torch's optimizer
      skips every parameter), so "skip" reads the flag every micro-step: the price of skipping.
    """

    def __init__(self, trainer, policy: str):
        self.trainer, self.policy = trainer, policy
        self.skipped_steps: list[int] = []
        self.skip_this_step = False
        self._pending = None  # "stop": (any non-finite so far, its first step, that step's loss), on the device
        self._backward = trainer.accelerator.backward
        trainer.accelerator.backward = self.backward_unless_skipped

    def any_rank_flag(self, loss: torch.Tensor) -> torch.Tensor:
        """1.0 when the loss is non-finite on any rank, as a device tensor (no host read)."""
        flag = (~torch.isfinite(loss.detach())).any().to(torch.float32).reshape(1)
        if is_multi_process():
            flag = flag.to(self.trainer.args.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return flag

    def check(self, loss: torch.Tensor) -> None:
        """Call with each training micro-step's loss, on every rank."""
        flag = self.any_rank_flag(loss)
        step = self.trainer.state.global_step + 1
        if self.policy == "stop":
            self._remember(flag, step, loss.detach().reshape(-1)[:1].to(flag))
            return
        if not bool(flag.item()):
            return
        self.skipped_steps.append(step)
        self.skip_this_step = True
        if self.trainer.is_world_process_zero():
            logger.warning(
                f"warning: non-finite training loss at step {step} (loss on this rank {loss.item()}): "
                "step skipped on every rank (--on_nonfinite_loss skip)."
            )

    def _remember(self, flag: torch.Tensor, step: int, loss: torch.Tensor) -> None:
        """Keep the first non-finite step and its loss on the device: torch.where, no host read."""
        step_tensor = torch.full_like(flag, float(step))
        if self._pending is None:
            self._pending = (flag, torch.where(flag > 0, step_tensor, -1.0), torch.where(flag > 0, loss, 0.0))
            return
        seen, first_step, first_loss = self._pending
        new = (flag > 0) & (seen == 0)
        self._pending = (
            torch.maximum(seen, flag),
            torch.where(new, step_tensor, first_step),
            torch.where(new, loss, first_loss),
        )

    def raise_if_seen(self) -> None:
        """ "stop": the one host read of the window; raises `NonFiniteLossError` if a step had a non-finite loss."""
        if self._pending is None:
            return
        seen, first_step, first_loss = torch.cat(self._pending).tolist()  # one read: flag, step, loss
        self._pending = None
        if not seen:
            return
        newest, _ = newest_complete_checkpoint(self.trainer.args.output_dir)
        raise NonFiniteLossError(
            f"non-finite training loss at step {int(first_step)} (loss on this rank {first_loss}); training stopped "
            f"(--on_nonfinite_loss stop). Newest complete checkpoint: {newest or 'none'}. Fix: lower --learning_rate "
            "or use bf16 instead of fp16, check the data, or pass --on_nonfinite_loss skip to skip such steps."
        )

    # ------------------------------------------------------------------ the Trainer's events ("stop")

    def on_step_end(self, args, state, control, **kwargs):
        if control.should_log or control.should_save or control.should_evaluate or control.should_training_stop:
            self.raise_if_seen()

    def on_epoch_end(self, args, state, control, **kwargs):
        self.raise_if_seen()  # an epoch's end may log, save or evaluate

    def on_train_end(self, args, state, control, **kwargs):
        self.raise_if_seen()

    # ------------------------------------------------------------------ "skip"

    def backward_unless_skipped(self, loss, **kwargs):
        if self.skip_this_step and self.trainer.is_deepspeed_enabled:
            return  # no engine.backward/step: DeepSpeed's optimizer and its lr schedule stay where they were
        self._backward(loss, **kwargs)

    def after_training_step(self, model) -> None:
        if self.skip_this_step and not self.trainer.is_deepspeed_enabled:
            model.zero_grad(set_to_none=True)
        self.skip_this_step = False
