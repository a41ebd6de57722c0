"""How a from-scratch ViT's weights start: transformers' init, or the original ViT's (timm's `weight_init='jax'`)
with big_vision's 2-D sine-cosine position table. The model stays a plain `ViTForImageClassification`."""

import math
import re
from contextlib import nullcontext

import torch
from torch import nn
from transformers import ViTForImageClassification
from transformers.integrations import is_deepspeed_zero3_enabled

from hf_vit_scaling.errors import UserInputError

WEIGHT_INITS = ("hf", "jax", "mimetic")
POSITION_EMBEDDING_INITS = ("random", "sincos2d")


def check_sincos_width(dim: int) -> None:
    """The table gives a quarter of the channels to each of sin/cos of x/y, with at least 2 frequencies (the exponent
    divides by dim/4 - 1): dim must be a multiple of 4 and at least 8."""
    if dim % 4 or dim < 8:
        raise UserInputError(
            f"--position_embedding_init sincos2d needs hidden_size divisible by 4 and at least 8 (got {dim}): a "
            "quarter of the channels per sin/cos of each axis. Fix: change hidden_size or use random."
        )


def sincos_2d_position_table(grid: int, dim: int, temperature: float = 10_000.0) -> torch.Tensor:
    """(grid * grid, dim) position table of big_vision's `posemb_sincos_2d` (big_vision/models/vit.py; Beyer et al.
    2022, "Better plain ViT baselines for ImageNet-1k"). With dim / 4 frequencies w_k = temperature^(-k / (dim/4 - 1)),
    k = 0 .. dim/4 - 1, the patch in row y, column x gets [sin(x w), cos(x w), sin(y w), cos(y w)]."""
    check_sincos_width(dim)
    y, x = torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij")
    omega = 1.0 / temperature ** (torch.arange(dim // 4) / (dim // 4 - 1))
    x = x.flatten()[:, None] * omega[None]
    y = y.flatten()[:, None] * omega[None]
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1)


def lecun_normal_(weight: torch.Tensor) -> None:
    """timm's lecun_normal_: variance 1 / fan_in, drawn as its trunc_normal_(std=sqrt(1/fan_in) / 0.8796...), where
    0.8796 is the std of a unit normal truncated at +-2 (the same call as timm's variance_scaling_)."""
    fan_in = weight[0].numel()
    nn.init.trunc_normal_(weight, std=math.sqrt(1.0 / fan_in) / 0.87962566103423978)


def _jax_init_module(name: str, module: nn.Module) -> None:
    """timm's init_weights_vit_jax for HF module names: zero head; Xavier-uniform linears with zero biases, except
    the MLP's biases ~ N(0, 1e-6); LeCun-normal patch projection."""
    if isinstance(module, nn.Linear):
        if name.startswith("classifier"):
            nn.init.zeros_(module.weight)
            nn.init.zeros_(module.bias)
            return
        nn.init.xavier_uniform_(module.weight)
        # transformers 5 names the MLP mlp.fc1/fc2 as timm does; 4.x named it intermediate.dense/output.dense.
        is_mlp = ".mlp." in name or re.search(r"(intermediate|layer\.\d+\.output)\.dense$", name)
        nn.init.normal_(module.bias, std=1e-6) if is_mlp else nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Conv2d):
        lecun_normal_(module.weight)
        nn.init.zeros_(module.bias)


def identity_like_factors(dim: int, alpha: float, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(L, R) with L @ R = alpha * Z + beta * I, Z uniform with variance 1 / dim, from the SVD U S V^T of that sum:
    L = U S^1/2, R = S^1/2 V^T (Trockman & Kolter 2023, "Mimetic Initialization of Self-Attention Layers", sec. 4)."""
    bound = math.sqrt(3.0 / dim)  # U(-b, b) has variance b^2 / 3 = 1 / dim
    target = alpha * torch.empty(dim, dim).uniform_(-bound, bound) + beta * torch.eye(dim)
    u, s, vh = torch.linalg.svd(target)
    return u * s.sqrt(), s.sqrt()[:, None] * vh


def _mimetic_attention(attention: nn.Module, num_heads: int) -> None:
    """Mimetic init of one attention block (y = x W^T in nn.Linear): per head h, W_q[h]^T W_k[h] is the rank-d_h
    part of 0.7 Z + 0.7 I (queries attend to similar keys, at first to their own position); W_v^T W_o^T =
    0.4 Z - 0.4 I. The paper's alpha/beta values (sec. 4); biases start at zero."""
    dim = attention.q_proj.weight.shape[1]
    head_dim = dim // num_heads
    for head in range(num_heads):
        left, right = identity_like_factors(dim, 0.7, 0.7)
        rows = slice(head * head_dim, (head + 1) * head_dim)
        attention.q_proj.weight[rows] = left[:, :head_dim].T
        attention.k_proj.weight[rows] = right[:head_dim]
    left, right = identity_like_factors(dim, 0.4, -0.4)
    attention.v_proj.weight.copy_(left.T)
    attention.o_proj.weight.copy_(right.T)


def _gathered(module: nn.Module, recurse: bool = False):
    """ZeRO-3 partitions parameters at construction (zero.Init): gather this module's own ones, let rank 0 write them,
    and re-partition (DeepSpeed's documented way to modify partitioned weights)."""
    if not is_deepspeed_zero3_enabled():
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(module.parameters(recurse=recurse)), modifier_rank=0)


@torch.no_grad()
def initialize_weights(model: ViTForImageClassification, weight_init: str, position_embedding_init: str) -> None:
    """Re-initialise a freshly built model in place; "hf" and "random" keep transformers' own init."""
    if weight_init in ("jax", "mimetic"):
        for name, module in model.named_modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                with _gathered(module):
                    _jax_init_module(name, module)
    if weight_init == "mimetic":
        blocks = [m for m in model.modules() if all(hasattr(m, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj"))]
        if not blocks:
            raise UserInputError(
                "--weight_init mimetic: no attention block with q_proj/k_proj/v_proj/o_proj (transformers 5 names). "
                "Fix: use transformers >= 5, or --weight_init jax."
            )
        for module in blocks:
            with _gathered(module, recurse=True):
                _mimetic_attention(module, model.config.num_attention_heads)
    if position_embedding_init == "sincos2d":
        embeddings = model.vit.embeddings
        config = model.config
        table = sincos_2d_position_table(config.image_size // config.patch_size, config.hidden_size)
        with _gathered(embeddings):
            embeddings.position_embeddings[0, 1:] = table
            embeddings.position_embeddings[0, :1] = 0.0  # the CLS token's position (MAE's choice)


def describe_init(weight_init: str, position_embedding_init: str) -> str:
    """' with jax init and sincos2d position embeddings' for the model description; '' for transformers' defaults."""
    parts = [f"{weight_init} init"] * (weight_init != "hf")
    parts += [f"{position_embedding_init} position embeddings"] * (position_embedding_init != "random")
    return f" with {' and '.join(parts)}" if parts else ""
