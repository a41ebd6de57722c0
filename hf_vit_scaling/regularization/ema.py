"""The EMA of the weights (`EMACallback`): ema <- d ema + (1 - d) w after every optimizer step (timm's ModelEma),
kept in float32 beside the model; its state goes into each checkpoint folder (`save_state`) and is read back on
resume, through the same key conversion and strict check as the model's weights (`training.checkpoints`).
"""

import contextlib
import os

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import TrainerCallback

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.models.weights import checkpoint_step, converted_state_dict, state_dict_problems

EMA_FILENAME = "ema.safetensors"


def check_ema_resumable(ema_decay: float | None, resume_from: str | None) -> None:
    """--ema_decay on a resumed run: the checkpoint must hold the EMA it continues."""
    if ema_decay is not None and resume_from and not os.path.isfile(os.path.join(resume_from, EMA_FILENAME)):
        raise UserInputError(
            f"--ema_decay: the checkpoint {resume_from} has no {EMA_FILENAME} (saved without "
            "--ema_decay), so the EMA cannot continue exactly. Fix: resume from a checkpoint saved "
            "with --ema_decay, or start a new run."
        )


# ---------------------------------------------------------------- stochastic depth


# ---------------------------------------------------------------- EMA of the weights


def _is_partitioned(model: torch.nn.Module) -> bool:
    """ZeRO-3 replaces each parameter by a local shard (attribute `ds_id`); ZeRO 0-2 keep them whole."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


class EMACallback(TrainerCallback):
    """ema_k = d ema_(k-1) + (1 - d) w_k after optimizer step k, from ema_0 = the weights at the start of training:
    ema_k = d^k w_0 + (1 - d) sum_j d^(k-j) w_j. 1 / (1 - d) is about how many steps it averages over (0.999: the
    last ~1,000), so d must leave that well below the run's length or the EMA is mostly the initial weights.

    Float32 copies of every parameter on its device (one model's worth of memory). Under DDP and ZeRO 0-2 each rank
    holds whole, identical parameters after every step, so each rank's EMA is the same; ZeRO-3 (parameters split
    across ranks) is refused. `resume_from`: the checkpoint folder training resumes from; its `ema.safetensors` is
    loaded so the EMA continues exactly. `save_state(folder)` writes it; call it from the main process while the
    checkpoint is written (before it is marked complete).
    """

    def __init__(self, decay: float, resume_from: str | None = None):
        self.decay = decay
        self.resume_from = resume_from
        self.shadow: dict[str, torch.Tensor] | None = None
        self.global_step = 0  # the optimizer step the EMA includes
        self.best_step: int | None = None  # set when the EMA was put back to the best checkpoint's at the end
        # Steps whose optimizer update was left out (--on_nonfinite_loss skip); the trainer shares its list. The
        # weights did not move on such a step, so averaging them in again would pull the EMA toward them: skipped.
        self.skipped_steps: list[int] = []

    # -- Trainer events

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if _is_partitioned(model):
            raise UserInputError(
                "--ema_decay works with plain DDP and ZeRO 0-2; ZeRO-3 keeps only a shard of each "
                "parameter per rank. Fix: use ds_configs/zero2.json."
            )
        if self.resume_from:
            self.load_state(self.resume_from, model, state.global_step)
        else:
            self.shadow = {name: p.detach().float().clone() for name, p in model.named_parameters()}
            self.global_step = state.global_step

    def on_train_end(self, args, state, control, model=None, **kwargs):
        """--load_best_model_at_end: the Trainer has put the best checkpoint's weights in the model (its
        `_load_best_model` runs before `on_train_end`); put that checkpoint's EMA beside them, so the EMA saved and
        evaluated with the model belongs to the same step, not the last one."""
        best = state.best_model_checkpoint
        if not (args.load_best_model_at_end and best and os.path.isdir(best)):
            return
        step = checkpoint_step(best)
        if step is not None and step != self.global_step:
            self.load_state(best, model, step)
            self.best_step = step

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step not in self.skipped_steps:
            self.update(model)
        self.global_step = state.global_step

    # -- the average

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        names = list(self.shadow)
        params = dict(model.named_parameters())
        current = [params[name].detach().float() for name in names]  # no copy for float32 weights
        torch._foreach_lerp_([self.shadow[name] for name in names], current, 1.0 - self.decay)

    @contextlib.contextmanager
    def applied(self, model: torch.nn.Module):
        """Within the block `model` holds the EMA weights (cast to its dtypes); its own weights come back after.
        E.g. `with ema.applied(trainer.model): trainer.evaluate(metric_key_prefix="eval_ema")`."""
        saved = {}
        with torch.no_grad():
            for name, p in model.named_parameters():
                saved[name] = p.detach().clone()
                p.copy_(self.shadow[name])
        try:
            yield model
        finally:
            with torch.no_grad():
                for name, p in model.named_parameters():
                    p.copy_(saved[name])

    # -- checkpoints

    def save_state(self, folder: str) -> str:
        path = os.path.join(folder, EMA_FILENAME)
        tmp = f"{path}.tmp-{os.getpid()}"
        tensors = {name: t.detach().cpu().contiguous() for name, t in self.shadow.items()}
        save_file(tensors, tmp, metadata={"decay": repr(self.decay), "global_step": str(self.global_step)})
        os.replace(tmp, path)  # a reader sees no file or the whole file
        return path

    def load_state(self, folder: str, model: torch.nn.Module, global_step: int) -> None:
        path = os.path.join(folder, EMA_FILENAME)
        if not os.path.isfile(path):
            raise UserInputError(
                f"--ema_decay: {folder} has no {EMA_FILENAME} (it was saved without --ema_decay), so the EMA cannot "
                "continue exactly. Fix: resume from a checkpoint saved with --ema_decay, or start a new run."
            )
        with safe_open(path, framework="pt") as f:
            saved_step = int(f.metadata().get("global_step", -1))
        if saved_step != global_step:
            raise UserInputError(
                f"{path} holds the EMA of step {saved_step}, the checkpoint is at step "
                f"{global_step}. Fix: resume from an intact checkpoint folder."
            )
        params = dict(model.named_parameters())
        # Through the key conversion of every other load (a no-op for the parameter names we save), then strict.
        loaded = converted_state_dict(model, load_file(path))
        problem = state_dict_problems(params, loaded)
        if problem:
            raise UserInputError(
                f"{path} does not restore the EMA of every parameter: {problem}. Fix: resume with the model that "
                "saved it, or start a new run."
            )
        self.shadow = {name: loaded[name].to(params[name].device, torch.float32) for name in params}
        self.global_step = global_step


# ---------------------------------------------------------------- layer-wise lr decay
