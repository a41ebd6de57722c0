"""`DropPath`: stochastic depth (Huang et al. 2016) as DeiT uses it. transformers' `ViTLayer` has two residual
branches, x = x + dropout(attention(norm(x))) and x = x + dropout(mlp(norm(x))); a forward hook on each layer's
`attention` and `mlp` multiplies the branch output, per image, by 0 (probability p_i) or 1 / (1 - p_i), so the
residual add sees timm's `drop_path(branch)`. p_i = rate x i / (L - 1) (DeiT's `torch.linspace(0, rate, L)`).
Hooks only: the model stays a plain `ViTForImageClassification`, saved without them; in eval mode they return
the output untouched. Masks come from the global RNG, which gradient checkpointing restores for its recompute.
"""

import torch
from transformers.models.vit.modeling_vit import ViTEmbeddings, ViTLayer

from hf_vit_scaling.errors import UserInputError


def vit_blocks(model: torch.nn.Module) -> tuple[str | None, list[tuple[str, ViTLayer]]]:
    """(the embeddings' module name, [(name, ViTLayer)] in depth order)."""
    embeddings, layers = None, []
    for name, module in model.named_modules():
        if isinstance(module, ViTEmbeddings) and embeddings is None:
            embeddings = name
        elif isinstance(module, ViTLayer):
            layers.append((name, module))
    return embeddings, layers


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
