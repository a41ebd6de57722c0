"""`NonFiniteLossPolicy`: what a NaN/inf training loss on any rank does (`--on_nonfinite_loss`)."""

import torch
import torch.distributed as dist

from hf_vit_scaling.errors import NonFiniteLossError
from hf_vit_scaling.log import logger
from hf_vit_scaling.parallel.distributed import is_multi_process
from hf_vit_scaling.training.checkpoints import newest_complete_checkpoint

NONFINITE_POLICIES = ("stop", "skip")


class NonFiniteLossPolicy:
    """What a NaN/inf training loss on any rank does. The ranks agree through one all-reduce of a flag per
    micro-step (MAX), so every rank takes the same decision at the same step.

    - "stop": raise `NonFiniteLossError` naming the step and the newest complete checkpoint;
    - "skip": leave that optimizer step out on every rank. Under DeepSpeed the backward (and so DeepSpeed's optimizer
      step and lr schedule) is not run; under the plain Trainer the backward runs (DDP needs every rank in it) and
      the gradients are dropped, so torch's optimizer skips every parameter (no update, no moment update).
    """

    def __init__(self, trainer, policy: str):
        self.trainer, self.policy = trainer, policy
        self.skipped_steps: list[int] = []
        self.skip_this_step = False
        self._backward = trainer.accelerator.backward
        trainer.accelerator.backward = self.backward_unless_skipped

    def on_any_rank(self, loss: torch.Tensor) -> bool:
        flag = (~torch.isfinite(loss.detach())).any().to(torch.float32).reshape(1)
        if is_multi_process():
            flag = flag.to(self.trainer.args.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def check(self, loss: torch.Tensor) -> None:
        """Call with each training micro-step's loss, on every rank."""
        if not self.on_any_rank(loss):
            return
        step = self.trainer.state.global_step + 1
        where = f"at step {step} (loss on this rank {loss.item()})"
        if self.policy == "stop":
            newest, _ = newest_complete_checkpoint(self.trainer.args.output_dir)
            raise NonFiniteLossError(
                f"non-finite training loss {where}; training stopped (--on_nonfinite_loss stop). "
                f"Newest complete checkpoint: {newest or 'none'}. Fix: lower --learning_rate or use bf16 instead of "
                "fp16, check the data, or pass --on_nonfinite_loss skip to skip such steps."
            )
        self.skipped_steps.append(step)
        self.skip_this_step = True
        if self.trainer.is_world_process_zero():
            logger.warning(f"warning: non-finite training loss {where}: step skipped on every rank "
                           "(--on_nonfinite_loss skip).")  # fmt: skip

    def backward_unless_skipped(self, loss, **kwargs):
        if self.skip_this_step and self.trainer.is_deepspeed_enabled:
            return  # no engine.backward/step: DeepSpeed's optimizer and its lr schedule stay where they were
        self._backward(loss, **kwargs)

    def after_training_step(self, model) -> None:
        if self.skip_this_step and not self.trainer.is_deepspeed_enabled:
            model.zero_grad(set_to_none=True)
        self.skip_this_step = False
