"""Model-side regularization for Hugging Face ViTs: stochastic depth, an EMA of the weights, layer-wise lr decay.

- `DropPath`: stochastic depth (Huang et al. 2016) as DeiT uses it. transformers' `ViTLayer` has two residual
  branches, x = x + dropout(attention(norm(x))) and x = x + dropout(mlp(norm(x))); a forward hook on each layer's
  `attention` and `mlp` multiplies the branch output, per image, by 0 (probability p_i) or 1 / (1 - p_i), so the
  residual add sees timm's `drop_path(branch)`. p_i = rate x i / (L - 1) (DeiT's `torch.linspace(0, rate, L)`).
  Hooks only: the model stays a plain `ViTForImageClassification`, saved without them; in eval mode they return
  the output untouched. Masks come from the global RNG, which gradient checkpointing restores for its recompute.
- `EMACallback`: ema <- d ema + (1 - d) w after every optimizer step (timm's ModelEma), kept in float32 beside the
  model; its state goes into each checkpoint folder (`save_state`) and is read back on resume.
- `layer_decay_param_groups`: BEiT's layer-wise lr decay (Bao et al. 2022; timm `param_groups_layer_decay`):
  layer id 0 for the embeddings, i + 1 for block i, L + 1 for everything after the blocks (final LayerNorm, head);
  lr = base x decay^(L + 1 - id). Handed to the Trainer's own `create_optimizer` (see
  `layer_decay_optimizer_cls_and_kwargs`), which DeepSpeed uses for every ZeRO stage when the ds_config has no
  "optimizer" section. `LayerDecayReport` writes the groups as the optimizer holds them when training starts
  (output_dir/layer_decay_groups.json).
"""

import contextlib
import os

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import TrainerCallback
from transformers.models.vit.modeling_vit import ViTEmbeddings, ViTLayer

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.parallel.distributed import gather_object
from hf_vit_scaling.training.checkpoints import write_json_atomically

EMA_FILENAME = "ema.safetensors"
LAYER_DECAY_FILENAME = "layer_decay_groups.json"


def vit_blocks(model: torch.nn.Module) -> tuple[str | None, list[tuple[str, ViTLayer]]]:
    """(the embeddings' module name, [(name, ViTLayer)] in depth order)."""
    embeddings, layers = None, []
    for name, module in model.named_modules():
        if isinstance(module, ViTEmbeddings) and embeddings is None:
            embeddings = name
        elif isinstance(module, ViTLayer):
            layers.append((name, module))
    return embeddings, layers


# ---------------------------------------------------------------- stochastic depth


def drop_path_rates(num_layers: int, rate: float) -> list[float]:
    """DeiT / timm: layer i drops its branches with rate x i / (L - 1): 0 for the first layer, `rate` for the last."""
    if num_layers <= 1:
        return [0.0] * num_layers
    return [rate * i / (num_layers - 1) for i in range(num_layers)]


def _drop_branch(rate: float):
    keep = 1.0 - rate

    def hook(module, args, output):
        if not module.training:
            return None  # evaluation: the output as it is
        branch = output[0] if isinstance(output, tuple) else output
        shape = (branch.shape[0],) + (1,) * (branch.dim() - 1)  # one draw per image
        mask = branch.new_empty(shape).bernoulli_(keep).div_(keep)
        branch = branch * mask
        return (branch, *output[1:]) if isinstance(output, tuple) else branch

    return hook


class DropPath:
    """Stochastic depth on every `ViTLayer` of `model`, through forward hooks (`remove()` takes them off)."""

    def __init__(self, model: torch.nn.Module, rate: float):
        _, layers = vit_blocks(model)
        if not layers:
            raise UserInputError(
                "--drop_path_rate needs a ViT (transformers ViTLayer blocks); this model has none. "
                "Fix: drop --drop_path_rate."
            )
        self.rates = drop_path_rates(len(layers), rate)
        self._handles = []
        for (_, layer), layer_rate in zip(layers, self.rates):
            if layer_rate > 0:
                for branch in (layer.attention, layer.mlp):  # the two residual branches
                    self._handles.append(branch.register_forward_hook(_drop_branch(layer_rate)))

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


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

    def on_step_end(self, args, state, control, model=None, **kwargs):
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
        loaded = load_file(path)
        params = dict(model.named_parameters())
        if set(loaded) != set(params):
            raise UserInputError(f"{path} does not match the model's parameters. Fix: resume with the same model.")
        self.shadow = {name: loaded[name].to(params[name].device, torch.float32) for name in params}
        self.global_step = global_step


# ---------------------------------------------------------------- layer-wise lr decay


def vit_layer_ids(model: torch.nn.Module) -> tuple[dict[str, int], int]:
    """({parameter name: layer id}, L): embeddings 0, block i -> i + 1, everything after the blocks L + 1."""
    embeddings, layers = vit_blocks(model)
    if embeddings is None or not layers:
        raise UserInputError("--layer_decay needs a ViT (ViTEmbeddings + ViTLayer blocks). Fix: drop --layer_decay.")
    prefixes = [(name + ".", i + 1) for i, (name, _) in enumerate(layers)]
    ids = {}
    for name, _ in model.named_parameters():
        if name.startswith(embeddings + "."):
            ids[name] = 0
        else:
            ids[name] = next((i for prefix, i in prefixes if name.startswith(prefix)), len(layers) + 1)
    return ids, len(layers)


def layer_decay_param_groups(
    model: torch.nn.Module, learning_rate: float, weight_decay: float, layer_decay: float, decay_parameter_names
) -> list[dict]:
    """Optimizer parameter groups, one per (layer id, weight decay or not): lr = learning_rate x
    layer_decay^(L + 1 - id). ViT-B (L = 12) at decay 0.65: head 1x, block 11 0.65x, embeddings 0.65^13 = 0.0037x.
    Weight decay follows `decay_parameter_names` (the Trainer's rule: not on biases and LayerNorms).
    The head's groups come first: the Trainer logs the first group's lr as `learning_rate`, which is then the base lr.
    LR schedules keep the ratios: each group's lr is its initial lr times the schedule's factor."""
    ids, num_layers = vit_layer_ids(model)
    decay_names = set(decay_parameter_names)
    groups: dict[tuple[int, bool], dict] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        layer_id, decays = ids[name], name in decay_names
        scale = layer_decay ** (num_layers + 1 - layer_id)
        group = groups.setdefault(
            (layer_id, decays),
            {
                "params": [],
                "weight_decay": weight_decay if decays else 0.0,
                "lr": learning_rate * scale,
                "layer_id": layer_id,
                "lr_scale": scale,
            },
        )
        group["params"].append(param)
    return [groups[key] for key in sorted(groups, key=lambda key: (-key[0], not key[1]))]


def layer_decay_optimizer_cls_and_kwargs(trainer, model: torch.nn.Module, layer_decay: float) -> tuple[type, dict]:
    """The Trainer's optimizer (from --optim and its arguments) with layer-decay groups as its `params`: set it as
    `trainer.optimizer_cls_and_kwargs` before the Trainer's `create_optimizer` runs (it pops "params")."""
    optimizer_cls, kwargs = trainer.get_optimizer_cls_and_kwargs(trainer.args, model)
    takes_groups = isinstance(optimizer_cls, type) and issubclass(optimizer_cls, torch.optim.Optimizer)
    if not takes_groups or any(key in kwargs for key in ("params", "model", "optimizer_dict")):
        raise UserInputError(
            f"--layer_decay needs an optimizer built from parameter groups; --optim "
            f"{trainer.args.optim} builds its own. Fix: use --optim adamw_torch (or drop --layer_decay)."
        )
    groups = layer_decay_param_groups(
        model,
        trainer.args.learning_rate,
        trainer.args.weight_decay,
        layer_decay,
        trainer.get_decay_parameter_names(model),
    )
    return optimizer_cls, {**kwargs, "params": groups}


class LayerDecayReport(TrainerCallback):
    """Writes output_dir/layer_decay_groups.json when training starts: the optimizer's parameter groups, in its
    order, each with its layer id, lr scale, weight decay, parameter names and the lr it holds for the run's first
    step (the schedule's factor applied: with a warmup that lr is still small; `lr_scale` is the ratio to the base).

    The lrs are read from the optimizer the Trainer steps, after DeepSpeed wrapped it (its ZeRO optimizer steps the
    same groups), on every rank; `same_on_every_rank` says whether all ranks hold the same lrs. `record` (called
    when the groups are built) keeps the parameter names: ZeRO replaces each group's parameters by flat partitions.
    """

    def __init__(self):
        self.recorded: list[dict] | None = None

    def record(self, model: torch.nn.Module, groups: list[dict]) -> None:
        names = {id(p): name for name, p in model.named_parameters()}
        self.recorded = [{"layer_id": g["layer_id"], "params": [names[id(p)] for p in g["params"]]} for g in groups]

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        live = optimizer.param_groups
        if self.recorded is None or [g.get("layer_id") for g in live] != [g["layer_id"] for g in self.recorded]:
            raise RuntimeError("--layer_decay: the optimizer's parameter groups are not the ones built for it.")
        lrs = [g["lr"] for g in live]
        every_rank = gather_object(lrs)  # a collective: every rank runs on_train_begin
        if not args.should_save:
            return
        chain, inner = [], optimizer
        while inner is not None and len(chain) < 8:  # the wrappers around torch's optimizer, outermost first
            chain.append(type(inner).__name__)
            inner = getattr(inner, "optimizer", None)
        groups = [
            {"layer_id": g["layer_id"], "lr_scale": g["lr_scale"], "lr": g["lr"], "weight_decay": g["weight_decay"],
             "params": rec["params"]}
            for g, rec in zip(live, self.recorded)
        ]  # fmt: skip
        os.makedirs(args.output_dir, exist_ok=True)
        write_json_atomically(
            os.path.join(args.output_dir, LAYER_DECAY_FILENAME),
            {
                "step": state.global_step + 1,
                "optimizer": chain,
                "world_size": len(every_rank),
                "same_on_every_rank": all(rank_lrs == lrs for rank_lrs in every_rank),
                "groups": groups,
            },
        )
