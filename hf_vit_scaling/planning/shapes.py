"""The ViT a plan is for, its activations, and the tables the planner's modules share.

Engines (one code path each, as the recipe runs them): plain DDP (the Trainer without DeepSpeed), DeepSpeed ZeRO-1,
ZeRO-2, ZeRO-2 with the optimizer offloaded to the CPU, ZeRO-3, ZeRO-3 with parameters and optimizer offloaded, and
FSDP2 full sharding (the Trainer's `--fsdp --fsdp_config fsdp_configs/fsdp2.json`).

The tables: `ENGINES` with their names and recipe flags (`ENGINE_NAMES`, `ENGINE_FLAGS`), `PRECISIONS`, the ZeRO
engines' DeepSpeed JSON (`read_ds_configs`), the DeepSpeed defaults the planner relies on, and the assumed bus
bandwidths of GPU links and networks (`INTERCONNECTS`, `NETWORKS`: the defaults of `memory.PlanSettings`, the
inputs of `speed.engine_speed`).

Activations: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", §4.1,
Eq. (1): a transformer layer stores sbh(34 + 5as/h) bytes (s tokens, b batch, h hidden, a heads; 2-byte activations
and 1-byte dropout masks). `layer_activation_elements` adapts it to Hugging Face's ViT (see there).
`activation_bytes` turns those elements into bytes per rank (precision, autocast, gradient checkpointing,
sequence parallelism).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

GiB = 1024**3

ENGINES = ("ddp", "zero1", "zero2", "zero2_offload", "zero3", "zero3_offload", "fsdp2")
# Planned on more than one node only (on one node it is FSDP2 full sharding): FSDP2 hybrid sharding (HSDP), the
# model sharded over the GPUs of a node and replicated across nodes (`fully_shard` on a 2-D device mesh,
# torch.distributed.fsdp; "HYBRID_SHARD" in FSDP1). The recipe's fsdp_configs/ do not build it.
HSDP = "hsdp"
ALL_ENGINES = (*ENGINES, HSDP)
ENGINE_NAMES = {
    "ddp": "DDP",
    "zero1": "ZeRO-1",
    "zero2": "ZeRO-2",
    "zero2_offload": "ZeRO-2 + optimizer offload",
    "zero3": "ZeRO-3",
    "zero3_offload": "ZeRO-3 + param/optimizer offload",
    "fsdp2": "FSDP2 full shard",
    HSDP: "FSDP2 HSDP (shard in node)",
}
# How the recipe runs each engine (recipes/train_vit.py flags).
ENGINE_FLAGS = {
    "ddp": "(no --ds_config; torchrun/accelerate start DDP)",
    "zero1": "--ds_config ds_configs/zero1.json",
    "zero2": "--ds_config ds_configs/zero2.json",
    "zero2_offload": "--ds_config ds_configs/zero2_offload.json",
    "zero3": "--ds_config ds_configs/zero3.json",
    "zero3_offload": "--ds_config ds_configs/zero3_offload.json",
    "fsdp2": "--fsdp --fsdp_config fsdp_configs/fsdp2.json",
    HSDP: "(not in fsdp_configs/: FSDP2 fully_shard on a (nodes, GPUs per node) device mesh)",
}
# fp16 is planned as bf16 (2-byte weights, gradients and activations, fp32 master weights and moments): the loss
# scaler's few scalars are not counted. Mixed precision keeps fp32 master weights in both (Micikevicius et al. 2018,
# "Mixed Precision Training", arXiv 1710.03740, §3.1).
PRECISIONS = ("bf16", "fp16", "fp32")


def is_half(precision: str) -> bool:
    """Whether the run computes in a 2-byte dtype (bf16 or fp16)."""
    return precision in ("bf16", "fp16")


def bytes_per_element(precision: str) -> int:
    """The working dtype's size: 2 bytes in bf16/fp16 (DeepSpeed's and FSDP2's parameters, the teacher cast to the
    run's dtype), 4 in fp32."""
    return 2 if is_half(precision) else 4


def read_ds_configs(folder: str) -> dict[str, dict]:
    """The DeepSpeed JSON of each ZeRO engine from a folder laid out like the project's ds_configs/."""
    configs = {}
    for engine in ENGINES:
        path = os.path.join(folder, f"{engine}.json")
        if engine.startswith("zero") and os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                configs[engine] = json.load(f)
    return configs


# Bus bandwidths in GB/s (10^9 bytes/s) the collectives are assumed to reach: ASSUMPTIONS, not measurements, set
# at roughly 65-90% of each link's line rate per direction. Measure yours (nccl-tests' "busbw") and pass a number.
INTERCONNECTS = {
    "pcie3": 10.0,  # PCIe 3.0 x16: 15.75 GB/s per direction
    "pcie4": 20.0,  # PCIe 4.0 x16: 31.5 GB/s
    "pcie5": 40.0,  # PCIe 5.0 x16: 63 GB/s
    "nvlink3": 230.0,  # A100 NVLink: 300 GB/s per direction
    "nvlink4": 360.0,  # H100 NVLink: 450 GB/s per direction
}
NETWORKS = {
    "eth10": 1.1,  # 10 Gb/s Ethernet
    "eth25": 2.8,  # 25 Gb/s
    "eth100": 11.0,  # 100 Gb/s Ethernet or RoCE
    "roce100": 11.0,
    "ib-hdr": 22.0,  # 200 Gb/s InfiniBand HDR, one NIC per node
    "ib-ndr": 45.0,  # 400 Gb/s InfiniBand NDR, one NIC per node
    "8x-ib-ndr": 360.0,  # DGX H100-style: one 400 Gb/s NIC per GPU
    "8x-ib-hdr": 180.0,  # DGX A100-style: one 200 Gb/s HDR NIC per GPU, 8 x 25 = 200 GB/s per node
}

# DeepSpeed defaults the Hugging Face integration fills in for "auto" (transformers integrations/deepspeed.py):
# reduce_bucket_size = h², stage3_prefetch_bucket_size = 0.9·h², stage3_param_persistence_threshold = 10·h (the recipe
# resolves its own instead: parallel/deepspeed_config.py).
# DeepSpeed's own default stage3_max_reuse_distance is 1e9 parameters (deepspeed/runtime/zero/config.py).
ZERO3_MAX_REUSE_DISTANCE = 1_000_000_000
DEEPSPEED_DEFAULT_REDUCE_BUCKET = 500_000_000

# --------------------------------------------------------------------------- model shape and parameter counts


def transformer_layer_sizes(prefix: str, width: int, intermediate: int, mlp: str = "gelu") -> dict[str, list[int]]:
    """One pre-norm transformer block's tensors, {name: [weight, bias] element counts}: q/k/v/o projections
    width x width, two LayerNorms, and the MLP (ViT-B/16: 7,087,872 per block):

    * "gelu": fc1 width -> intermediate, fc2 intermediate -> width (Dosovitskiy et al. 2021, arXiv 2010.11929);
    * "swiglu": SwiGLU(x) = (SiLU(x W1) * x W2) W3 (Shazeer 2020, "GLU Variants Improve Transformer", arXiv
      2002.05202, Eq. 6), with W1 and W2 fused in one projection width -> 2 x intermediate, as DINOv2's
      `SwiGLUFFNFused` builds it (biases on): 3·h·I + 2I + h parameters. DINOv2's ViT-g/14 (h 1536, I 4096):
      3 x 1536 x 4096 + 2 x 4096 + 1536 = 18,884,096 per block, against GELU's 2hI + I + h at the same I.
    """
    w, i = width, intermediate
    sizes = {f"{prefix}.{proj}": [w * w, w] for proj in ("q_proj", "k_proj", "v_proj", "o_proj")}
    sizes |= {f"{prefix}.layernorm_before": [w, w], f"{prefix}.layernorm_after": [w, w]}
    if mlp == "swiglu":
        sizes |= {f"{prefix}.w12": [w * 2 * i, 2 * i], f"{prefix}.w3": [i * w, w]}
    else:
        sizes |= {f"{prefix}.fc1": [w * i, i], f"{prefix}.fc2": [i * w, w]}
    return sizes


MLPS = ("gelu", "swiglu")


@dataclass(frozen=True)
class VitShape:
    """The numbers of a Hugging Face `ViTForImageClassification` the planner needs (ViTConfig's attribute names,
    so `flops.vit_forward_macs_per_image` accepts it)."""

    image_size: int
    patch_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    num_channels: int = 3
    num_labels: int = 1000
    mlp: str = "gelu"  # "gelu" or "swiglu" (`transformer_layer_sizes`)
    patch_dropout: float = 0.0  # share of patches dropped after the patch embedding (FLIP / EVA-CLIP)

    @property
    def all_tokens(self) -> int:
        """Patches + CLS: ViT-B/16 at 224 px has 14 × 14 + 1 = 197 (the position table's length)."""
        return (self.image_size // self.patch_size) ** 2 + 1

    @property
    def tokens(self) -> int:
        """The tokens the layers run on: patches + CLS, or with patch dropout r the kept patches + CLS. OpenCLIP's
        `PatchDropout` (which EVA-CLIP's --force-patch-dropout sets; Li et al. 2023, "Scaling Language-Image
        Pre-training via Masking", arXiv 2212.00794) keeps max(1, int(P·(1 - r))) patches: 256 at r = 0.5 -> 129."""
        patches = (self.image_size // self.patch_size) ** 2
        if self.patch_dropout:
            patches = max(1, int(patches * (1 - self.patch_dropout)))
        return patches + 1

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices h x I in one MLP: 2 for GELU, 3 for SwiGLU; `models.flops.layer_macs` counts N·h·I
        multiply-accumulates for each."""
        return 3 if self.mlp == "swiglu" else 2

    def parameter_sizes(self) -> dict[str, list[int]]:
        """Element counts of every parameter tensor, grouped by the module that owns it (HF ViT, `qkv_bias=True`,
        no pooler: `ViTForImageClassification` builds `ViTModel(add_pooling_layer=False)`)."""
        h, inter, c, p, n = (
            self.hidden_size,
            self.intermediate_size,
            self.num_channels,
            self.patch_size,
            self.num_labels,
        )
        groups = {
            "embeddings": [h, self.all_tokens * h],  # cls_token, position_embeddings
            "patch_embeddings": [c * p * p * h, h],  # Conv2d weight, bias
        }
        for i in range(self.num_hidden_layers):
            groups.update(transformer_layer_sizes(f"layer{i}", h, inter, self.mlp))
        groups["layernorm"] = [h, h]
        groups["classifier"] = [h * n, n]
        return groups

    @property
    def num_parameters(self) -> int:
        """ViT-B/16, 1000 classes: 86,567,656 (what `sum(p.numel())` gives for the HF model)."""
        return sum(sum(sizes) for sizes in self.parameter_sizes().values())

    @property
    def largest_module_parameters(self) -> int:
        """Parameters of the largest single module (DeepSpeed's `model_to_params` "largest layer"):
        an MLP projection, h × I + I (ViT-B: 768 × 3072 + 3072 = 2,362,368)."""
        return max(sum(sizes) for sizes in self.parameter_sizes().values())

    @property
    def layer_parameters(self) -> int:
        """One ViTLayer: 4(h² + h) + 2·2h + the MLP: 2·h·I + I + h with GELU (ViT-B: 7,087,872), 3·h·I + 2I + h with
        SwiGLU (`transformer_layer_sizes`)."""
        h, inter = self.hidden_size, self.intermediate_size
        mlp = 3 * h * inter + 2 * inter + h if self.mlp == "swiglu" else 2 * h * inter + inter + h
        return 4 * (h * h + h) + 4 * h + mlp

    def zero3_persistent_parameters(self, threshold: int) -> int:
        """Parameters ZeRO-3 never partitions: tensors of at most `threshold` (`stage3_param_persistence_threshold`)
        elements stay whole on every rank (DeepSpeed's `mark_persistent_parameters`): biases, LayerNorms, the CLS
        token, a small classifier; every tensor of the tiny presets under DeepSpeed's default 1e5."""
        return sum(n for sizes in self.parameter_sizes().values() for n in sizes if n <= threshold)


def vit_shape(
    preset: dict, image_size: int | None = None, patch_size: int | None = None, num_labels: int = 1000
) -> VitShape:
    """A `VitShape` from a `models.MODEL_PRESETS` entry with optional overrides (as the recipe applies them)."""
    values = dict(preset)
    values["image_size"] = image_size or values["image_size"]
    values["patch_size"] = patch_size or values["patch_size"]
    return VitShape(num_labels=num_labels, **values)


@dataclass(frozen=True)
class MaeShape(VitShape):
    """A Hugging Face `ViTMAEForPreTraining` (recipes/pretrain_mae.py): the VitShape's encoder, which runs on the
    visible tokens only, and a decoder of its own width and depth on every token (He et al. 2021, arXiv 2111.06377).
    `model_type` makes `flops.forward_flops_per_image` count it with the MAE formula. No classifier."""

    mask_ratio: float = 0.75
    decoder_hidden_size: int = 512
    decoder_num_hidden_layers: int = 8
    decoder_num_attention_heads: int = 16
    decoder_intermediate_size: int = 2048
    model_type: str = "vit_mae"

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def visible_tokens(self) -> int:
        """The encoder's sequence: CLS + int(P · (1 - r)) patches (ViT-B/16 at 0.75: 1 + 49 = 50)."""
        return 1 + int(self.num_patches * (1 - self.mask_ratio))

    def parameter_sizes(self) -> dict[str, list[int]]:
        """The encoder's tensors (no classifier) and the decoder's: embedding D→d, mask token, its fixed sin-cos
        position table (a frozen parameter, as the encoder's), its layers, final LayerNorm and the pixel
        prediction d→p²C (ViT-B/16 with the paper's decoder: 111,907,840, `sum(p.numel())` of the HF model)."""
        groups = {k: v for k, v in super().parameter_sizes().items() if k != "classifier"}
        d, i, pixels = self.decoder_hidden_size, self.decoder_intermediate_size, self.num_channels * self.patch_size**2
        groups["decoder_embeddings"] = [self.hidden_size * d, d, d, self.tokens * d]  # embed, mask token, positions
        for n in range(self.decoder_num_hidden_layers):
            groups.update(transformer_layer_sizes(f"decoder{n}", d, i))
        groups["decoder_norm"] = [d, d]
        groups["decoder_pred"] = [d * pixels, pixels]
        return groups


def mae_shape(
    preset: dict, decoder: dict, mask_ratio: float = 0.75, image_size: int | None = None, patch_size: int | None = None
) -> MaeShape:
    """A `MaeShape` from a `models.MODEL_PRESETS` entry and a `models.mae.DECODER_PRESETS` entry."""
    values = dict(preset)
    values["image_size"] = image_size or values["image_size"]
    values["patch_size"] = patch_size or values["patch_size"]
    return MaeShape(**values, **decoder, mask_ratio=mask_ratio, num_labels=0)


# --------------------------------------------------------------------------- activations


def layer_activation_elements(shape: VitShape, batch: int, sequence_parallel_size: int = 1) -> dict[str, int]:
    """Elements one ViTLayer keeps for backward (dropout 0, SDPA attention), by what keeps them.

    Korthikanti et al. 2022, Eq. (1), counts per layer sbh(34 + 5as/h) bytes at 2 bytes per activation:
    attention 11sbh + 5as²b (QKV input 2, Q and K 4, softmax 2as²b, its dropout mask as²b, dropout output 2as²b,
    V 2, projection input 2, dropout mask 1), MLP 19sbh (input 2, GELU input 8, GELU output 8, mask 1), LayerNorm
    inputs 4sbh. What changes for Hugging Face's ViT:

    * dropout is 0 (ViTConfig's default): torch's `dropout` returns its input unchanged when p = 0, so no masks
      (−2sbh bytes) and no dropout output (−2as²b);
    * attention runs through `scaled_dot_product_attention` with a fused kernel (FlashAttention / memory-efficient
      on GPUs, flash-attention-for-CPU on CPUs): no s × s softmax is stored (−2as²b, −as²b of its mask); the kernel
      keeps its output O (the projection input: its (b, s, a, d) memory layout makes transformers'
      `transpose(1, 2).contiguous()` a no-op) and an fp32 log-sum-exp per head and token;
    * the MLP width is `intermediate_size` I rather than a fixed 4h;
    * a SwiGLU MLP (`shape.mlp == "swiglu"`) keeps 4sbI instead of GELU's 2sbI: the fused W1|W2 output (2sbI: SiLU
      keeps its half x1, the product keeps the other half x2), SiLU's output (sbI, kept by the product) and the
      product (sbI, W3's input). Read from the autograd graph of `SwiGLUFFNFused` (SiLU and mul save their inputs);
      not measured here.

    In elements: LayerNorm inputs 2sbh, LayerNorm outputs (QKV and MLP inputs) 2sbh, Q, K, V 3sbh, O sbh, GELU input
    and output 2sbI; plus fp32 statistics: LayerNorm mean and rstd 2 × 2sb, log-sum-exp asb. With I = 4h that is
    16sbh elements, 32sbh bytes at 2 bytes: Korthikanti's 34sbh without the two dropout masks, and no 5as/h term.
    (Checked against the tensors autograd saves for a real HF ViT layer: tests/unit/planning/test_shapes.py.)
    With Ulysses sequence parallelism each rank keeps ceil(s / N) tokens (the sequence is padded to a multiple of N).
    """
    s = math.ceil(shape.tokens / sequence_parallel_size)
    sbh = s * batch * shape.hidden_size
    sbi = s * batch * shape.intermediate_size
    mlp_kept = 4 if getattr(shape, "mlp", "gelu") == "swiglu" else 2
    return {
        "residual": 2 * sbh,  # LayerNorm inputs: the layer input and the residual after attention
        "normed": 2 * sbh,  # LayerNorm outputs kept by q/k/v_proj and fc1
        "qkv": 3 * sbh,
        "attention_output": sbh,  # SDPA's output O, also o_proj's input
        "mlp": mlp_kept * sbi,  # GELU: its input and output; SwiGLU: W1|W2 output, SiLU output, product
        "fp32_statistics": 4 * s * batch + shape.num_attention_heads * s * batch,
    }


@dataclass(frozen=True)
class TokenStack:
    """A stack of identical transformer layers and the tokens they run on: a ViT's encoder, or an MAE's encoder
    (visible tokens) or decoder (every token). `layer_activation_elements` reads it as it reads a `VitShape`."""

    tokens: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_hidden_layers: int
    mlp: str = "gelu"

    @classmethod
    def of(cls, shape: VitShape) -> TokenStack:
        s = shape
        return cls(s.tokens, s.hidden_size, s.intermediate_size, s.num_attention_heads, s.num_hidden_layers, s.mlp)


def stack_bytes(
    stack: TokenStack,
    batch: int,
    precision: str,
    gradient_checkpointing: bool = False,
    sequence_parallel_size: int = 1,
    autocast: bool = False,
) -> dict[str, int]:
    """Bytes one rank keeps for a stack of layers (see `activation_bytes`): `one_layer`, `kept` (all layers, or
    each layer's input under checkpointing), `recomputed` (one layer less its input, under checkpointing),
    `forward_transient` (the last layer's MLP tensors under checkpointing), `backward_working_set` (sbI + sbh)."""
    element = bytes_per_element(precision)
    residual_element = 4 if autocast else element
    per_layer = layer_activation_elements(stack, batch, sequence_parallel_size)
    s_local = math.ceil(stack.tokens / sequence_parallel_size)
    sbh = s_local * batch * stack.hidden_size
    sbi = s_local * batch * stack.intermediate_size
    autocast_casts = 2 * sbh if autocast else 0  # k_proj's and v_proj's own bf16 copies of the LayerNorm output
    layer = (
        per_layer["residual"] * residual_element
        + (per_layer["normed"] + autocast_casts + per_layer["qkv"] + per_layer["attention_output"] + per_layer["mlp"])
        * element
        + per_layer["fp32_statistics"] * 4
    )
    layers = stack.num_hidden_layers
    if gradient_checkpointing:
        kept = layers * sbh * residual_element  # each layer's input
        recomputed = layer - sbh * residual_element  # in backward, one layer at a time (its input is kept already)
        forward_transient = per_layer["mlp"] * element  # the last layer's MLP tensors (fc1 and GELU outputs), not kept
    else:
        kept, recomputed, forward_transient = layers * layer, 0, 0
    # The gradient flowing into the layer (sbh) and the gradient of the MLP's widest kept tensor: GELU's output (sbI);
    # with SwiGLU the fused W1|W2 output's (2sbI).
    mlp_gradient = sbi * (2 if stack.mlp == "swiglu" else 1)
    return {
        "one_layer": layer,
        "kept": kept,
        "recomputed": recomputed,
        "forward_transient": forward_transient,
        "backward_working_set": (mlp_gradient + sbh) * element,
    }


def activation_bytes(
    shape: VitShape,
    batch: int,
    precision: str,
    gradient_checkpointing: bool = False,
    sequence_parallel_size: int = 1,
    autocast: bool = False,
) -> dict[str, int]:
    """Activation memory of one rank around the forward/backward boundary, in bytes, by part.

    Two moments can be the activations' peak (`forward_end`, `backward_start`; `total` is the larger):
    * the end of the forward pass: what the layers keep + pixels + the head (final LayerNorm, logits), and under
      checkpointing the last layer's transient MLP tensors (fc1 output and GELU output, 2sbI: a checkpointed layer's
      forward keeps nothing but its input);
    * the backward pass through the top layer: what the layers keep (the head's tensors are already freed: its
      backward runs first) + the backward working set, and under checkpointing the top layer recomputed (one layer
      less its input, which the checkpoint already holds).
    The backward working set is the gradient flowing into the layer (sbh) and the gradient of its GELU output (sbI):
    autograd frees each saved tensor when its node has run, so fc2's saved input is gone by the time the GELU's
    gradient is made (measured: the peak inside a layer's backward is the layer + sbI + sbh; an example in
    docs/planner.md, "How memory is estimated").

    `autocast`: torch autocast (plain DDP with --bf16) keeps fp32 weights, so the residual stream (embeddings + fp32
    position table, and every `x + residual`) stays fp32 while matmul inputs are bf16 copies. Autocast caches the
    bf16 copy of a weight but not of an activation (`cached_cast` caches leaf tensors that require grad only:
    aten/src/ATen/autocast_mode.cpp), so q_proj, k_proj and v_proj each cast the fp32 LayerNorm output on their own
    and each keeps its copy for backward: the attention input is kept 3 times in bf16 (plus once for fc1), 2sbh
    more than without autocast (measured: 16 bf16 casts per layer, 4 sbh-sized and the layer's weights).
    Gradient checkpointing (transformers checkpoints each ViTLayer, non-reentrant) keeps only each layer's input.

    Pixels (`pixels`): the fp32 batch the data loader put on the device lives the whole step (the Trainer holds the
    step's batches until the optimizer step), 4 bytes a pixel. In bf16 the patch convolution keeps a bf16 copy, 2 bytes
    a pixel, until its backward: DeepSpeed's Trainer casts floating inputs to the engine's dtype
    (transformers `Trainer._prepare_input`), autocast casts the convolution's input, FSDP2's MixedPrecisionPolicy casts
    the inputs of each sharded module (`_fsdp_state._cast_forward_inputs`).
    """
    if isinstance(shape, MaeShape):
        return mae_activation_bytes(shape, batch, precision, gradient_checkpointing, autocast)
    residual_element = 4 if autocast else bytes_per_element(precision)
    stack = stack_bytes(
        TokenStack.of(shape), batch, precision, gradient_checkpointing, sequence_parallel_size, autocast
    )
    layer, kept, recomputed = stack["one_layer"], stack["kept"], stack["recomputed"]
    forward_transient, working = stack["forward_transient"], stack["backward_working_set"]
    # The pixels (fp32 batch; in bf16 also the convolution's bf16 copy); the final LayerNorm's input, statistics and
    # output on the full sequence (gathered before it under sequence parallelism; the classifier keeps the CLS slice,
    # a view that keeps the whole output alive); the logits.
    pixel_count = batch * shape.num_channels * shape.image_size**2
    pixels = pixel_count * 4 + (pixel_count * 2 if is_half(precision) else 0)
    tokens = shape.tokens * batch
    head = 2 * tokens * shape.hidden_size * residual_element + 2 * tokens * 4 + batch * shape.num_labels * 4
    forward_end = kept + pixels + head + forward_transient
    backward_start = kept + recomputed + pixels + working
    return {
        "layers": kept + recomputed,
        "one_layer": layer,
        "pixels": pixels,
        "input_batch": pixel_count * 4,
        "embeddings_and_head": pixels + head,
        "backward_working_set": working,
        "forward_end": forward_end,
        "backward_start": backward_start,
        "total": max(forward_end, backward_start),
    }


def mae_activation_bytes(
    shape: MaeShape, batch: int, precision: str, gradient_checkpointing: bool = False, autocast: bool = False
) -> dict[str, int]:
    """`activation_bytes` of MAE pretraining (transformers' `ViTMAEForPreTraining`, norm_pix_loss on or off): the
    encoder's layers keep what a ViT layer keeps on the V visible tokens, the decoder's on all P + 1 tokens at the
    decoder's width d (`stack_bytes` for each). Besides the layers and the pixels (as for the ViT), what autograd
    keeps (listed from `saved_tensors_hooks` on a real model, tests/unit/planning/test_shapes.py):

    * masking: the patch embedding's output on all P patches, and the int64 index of the gather that keeps the
      visible ones (V - 1 patches x h, 8 bytes each);
    * the encoder's final LayerNorm on V tokens: input, output (decoder_embed's input), fp32 mean and rstd;
    * unshuffling: the P tokens with mask tokens, and the int64 gather index (P x d);
    * the decoder's final LayerNorm on P + 1 tokens (input, output: decoder_pred's input, statistics);
    * the loss: the fp32 difference prediction - target (P x p²C per image, for the square) and the mask.

    Backward starts at the top decoder layer: the working set and the recomputed layer are the decoder's."""
    residual = 4 if autocast else bytes_per_element(precision)
    s = shape
    encoder = TokenStack(
        s.visible_tokens, s.hidden_size, s.intermediate_size, s.num_attention_heads, s.num_hidden_layers
    )
    decoder = TokenStack(
        shape.tokens,
        shape.decoder_hidden_size,
        shape.decoder_intermediate_size,
        shape.decoder_num_attention_heads,
        shape.decoder_num_hidden_layers,
    )
    enc = stack_bytes(encoder, batch, precision, gradient_checkpointing, 1, autocast)
    dec = stack_bytes(decoder, batch, precision, gradient_checkpointing, 1, autocast)
    pixel_count = batch * shape.num_channels * shape.image_size**2
    pixels = pixel_count * 4 + (pixel_count * 2 if is_half(precision) else 0)
    h, d, patches = shape.hidden_size, shape.decoder_hidden_size, shape.num_patches * batch
    visible, every = shape.visible_tokens * batch, shape.tokens * batch
    masking = patches * h * residual + (visible - batch) * h * 8
    encoder_norm = 2 * visible * h * residual + 2 * visible * 4
    unshuffle = patches * d * residual + patches * d * 8
    decoder_norm = 2 * every * d * residual + 2 * every * 4
    loss = patches * shape.num_channels * shape.patch_size**2 * 4 + patches * 4
    around = masking + encoder_norm + unshuffle + decoder_norm + loss
    kept = enc["kept"] + dec["kept"]
    forward_end = kept + pixels + around + dec["forward_transient"]
    backward_start = kept + dec["recomputed"] + pixels + dec["backward_working_set"]
    return {
        "layers": kept + dec["recomputed"],
        "one_layer": max(enc["one_layer"], dec["one_layer"]),
        "encoder_layers": enc["kept"],
        "decoder_layers": dec["kept"],
        "pixels": pixels,
        "input_batch": pixel_count * 4,
        "embeddings_and_head": pixels + around,
        "backward_working_set": dec["backward_working_set"],
        "forward_end": forward_end,
        "backward_start": backward_start,
        "total": max(forward_end, backward_start),
    }
