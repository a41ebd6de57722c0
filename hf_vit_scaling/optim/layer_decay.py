"""`layer_decay_param_groups`: BEiT's layer-wise lr decay (Bao et al. 2022; timm `param_groups_layer_decay`):
layer id 0 for the embeddings, i + 1 for block i, L + 1 for everything after the blocks (final LayerNorm, head);
lr = base x decay^(L + 1 - id). `build.Optimization` hands them to the Trainer's own `create_optimizer` (see
`layer_decay_optimizer_cls_and_kwargs`), which DeepSpeed uses for every ZeRO stage when the ds_config has no
"optimizer" section. `LayerDecayReport` writes the groups as the optimizer holds them when training starts
(output_dir/layer_decay_groups.json).
"""

import os

import torch
from transformers import TrainerCallback

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.parallel.distributed import gather_object
from hf_vit_scaling.regularization.drop_path import vit_blocks
from hf_vit_scaling.utils import write_json_atomically

LAYER_DECAY_FILENAME = "layer_decay_groups.json"


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
