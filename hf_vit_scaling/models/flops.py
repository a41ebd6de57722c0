"""Analytic FLOP counts for HF ViTs, peak-throughput tables and model-FLOPs-utilisation (MFU) helpers.

Counting convention
-------------------
We count multiply-accumulates (MACs) of the matrix products only, following the per-token accounting of
Kaplan et al. 2020, "Scaling Laws for Neural Language Models", Table 1: per layer a token costs
``d·3d`` (QKV) + ``n_ctx·d`` (attention scores) + ``d·d`` (output projection) + ``2·d·d_ff`` (MLP) MACs.
Kaplan's table has a single ``n_ctx·d_attn`` attention term; like Hoffmann et al. 2022 ("Chinchilla",
Appendix F) we count both ``Q·Kᵀ`` and ``softmax(·)·V``, i.e. ``2·n_ctx·d`` per token.

LayerNorm, softmax, GELU, biases, residual adds and the position-embedding add are ignored: they are O(N·D)
element-wise work, well under 1% of the total for ViT-B and larger.

* forward FLOPs = 2 × forward MACs (one multiply + one add per MAC);
* backward ≈ 2 × forward (gradients w.r.t. both activations and weights, Kaplan et al. 2020 §2.1),
  so one training step ≈ 3 × forward = 6 × forward MACs.

Model FLOPs utilisation (MFU, Chowdhery et al. 2022 "PaLM", Appendix B) is achieved model FLOP/s divided by
the hardware's dense peak FLOP/s for the precision used; recomputation (activation checkpointing) is not
counted as useful work, so MFU is unaffected by it.
"""

from __future__ import annotations

import math
import re
import time

import torch


def as_pair(value: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    """Return ``(height, width)`` for an int or a 2-sequence (HF ViT accepts both for image/patch size)."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"expected an int or a (height, width) pair, got {value!r}")
        return int(value[0]), int(value[1])
    return int(value), int(value)


def vit_forward_macs_per_image(config, image_size: int | tuple[int, int] | None = None) -> int:
    """Forward multiply-accumulates for ONE image through a HF ``ViTForImageClassification``.

    ``config`` is a ``transformers.ViTConfig`` or any object with the attributes ``image_size``, ``patch_size``,
    ``num_channels``, ``hidden_size``, ``num_hidden_layers``, ``intermediate_size`` and (optionally)
    ``num_labels``; ``image_size``/``patch_size`` may be ints or ``(height, width)`` pairs. ``image_size``
    overrides ``config.image_size`` (e.g. when fine-tuning at a higher resolution).

    With P patches, N = P + 1 tokens (CLS), D = hidden_size, I = intermediate_size, L = layers:

    * patch embedding (a stride-p conv = one linear map per patch): P · (C·p_h·p_w) · D
    * per layer: QKV N·D·3D + scores N²·D + attention×V N²·D + output projection N·D² + MLP 2·N·D·I
      (= 12·N·D² + 2·N²·D when I = 4D; the head count does not matter as heads × head_dim = D)
    * classifier head on the CLS token only: D · num_labels

    Worked examples at 224 px (timm's reported GMACs, which also count norms/biases, in brackets):

    * ViT-B/16: P = 196, N = 197, D = 768 → per layer 12·197·768² + 2·197²·768 = 1.394 G + 0.060 G = 1.454 GMACs;
      × 12 layers = 17.447 G, + patch 196·768·768 = 0.116 G, + head 768·1000 = 0.0008 G → 17.56 G (timm: 17.58 G)
    * ViT-L/16: N = 197, D = 1024 → 2.558 G per layer × 24 = 61.40 G, + patch 0.154 G → 61.56 G (timm: 61.6 G)
    * ViT-H/14: P = 256, N = 257, D = 1280 → 5.222 G per layer × 32 = 167.10 G, + patch 256·588·1280 = 0.193 G
      → 167.29 G (timm: 167.4 G)

    A DeiT config (`model_type` "deit", the recipe's `--distillation_token` student,
    `DeiTForImageClassificationWithTeacher`) has one more token, N = P + 2 (CLS + distillation), and two heads, on
    the CLS and the distillation token: 2 · D · num_labels. vit-tiny-cpu at 16 px (P = 16, D = 96, I = 192, 4 layers,
    10 classes): the ViT's 17 tokens cost 5,310,144 MACs, the DeiT's 18 tokens 5,632,896
    (5,632,896 / 5,310,144 = 1.061: +6.1%).
    """
    img_h, img_w = as_pair(config.image_size if image_size is None else image_size)
    patch_h, patch_w = as_pair(config.patch_size)
    channels = int(config.num_channels)
    hidden = int(config.hidden_size)
    layers = int(config.num_hidden_layers)
    inter = int(config.intermediate_size)
    num_labels = int(getattr(config, "num_labels", 0) or 0)  # no head counted when the config has none

    # HF ViTPatchEmbeddings uses a Conv2d with kernel = stride = patch, so partial patches are dropped (floor).
    num_patches = (img_h // patch_h) * (img_w // patch_w)
    # Patch dropout r (the planner's shapes of published runs: EVA-CLIP): the layers see max(1, int(P·(1 - r)))
    # patches, the patch embedding all P. SwiGLU MLPs (the planner's DINOv2 shapes) have 3 weight matrices, not 2.
    dropout = float(getattr(config, "patch_dropout", 0.0) or 0.0)
    kept = max(1, int(num_patches * (1 - dropout))) if dropout else num_patches
    tokens = kept + extra_tokens(config)  # + CLS (+ DeiT's distillation token)

    patch_embed = num_patches * (channels * patch_h * patch_w) * hidden

    per_layer = layer_macs(tokens, hidden, inter, int(getattr(config, "mlp_matrices", 2)))

    # ViTForImageClassification classifies sequence_output[:, 0] (CLS) only; DeiT's two heads also [:, 1].
    head = classifier_heads(config) * hidden * num_labels

    return patch_embed + layers * per_layer + head


def layer_macs(tokens: int, hidden: int, inter: int, mlp_matrices: int = 2) -> int:
    """Forward MACs of one transformer layer on `tokens` tokens of width `hidden` with an MLP of width `inter`:
    `mlp_matrices` D x I matrices (2 for fc1 + fc2; 3 for SwiGLU's W1, W2, W3, Shazeer 2020, arXiv 2002.05202)."""
    qkv = tokens * hidden * 3 * hidden
    scores = tokens * tokens * hidden  # Q·Kᵀ summed over heads: heads · N² · head_dim = N²·D
    attn_v = tokens * tokens * hidden  # softmax(scores)·V, same shape argument
    out_proj = tokens * hidden * hidden
    mlp = mlp_matrices * tokens * hidden * inter  # fc1 D→I and fc2 I→D (SwiGLU: W1, W2 D→I and W3 I→D)
    return qkv + scores + attn_v + out_proj + mlp


def is_mae(config) -> bool:
    """A masked-autoencoder config (transformers' `ViTMAEConfig`, `ViTMAEForPreTraining`)."""
    return getattr(config, "model_type", None) == "vit_mae"


def mae_visible_patches(num_patches: int, mask_ratio: float) -> int:
    """Patches the MAE encoder sees: transformers keeps `int(P · (1 - mask_ratio))`
    (`ViTMAEEmbeddings.random_masking`), e.g. 196 patches at mask ratio 0.75 -> 49."""
    return int(num_patches * (1 - mask_ratio))


def mae_forward_macs_per_image(config, image_size: int | tuple[int, int] | None = None) -> int:
    """Forward multiply-accumulates for ONE image through transformers' ``ViTMAEForPreTraining``: what really runs.

    He et al. 2021, "Masked Autoencoders Are Scalable Vision Learners" (arXiv 2111.06377), §3: the encoder sees only
    the visible patches (and the CLS token); the lightweight decoder sees every position (encoded visible tokens +
    mask tokens). With P patches, mask ratio r, V = 1 + int(P·(1 - r)) encoder tokens, D/I/L the encoder's width, MLP
    width and depth, and d/i/l the decoder's, p the patch side and C the channels:

    * patch embedding runs on all P patches (masking happens after it): P · (C·p²) · D
    * encoder: L layers on V tokens (the ViT per-layer formula, `layer_macs`)
    * decoder embedding (D→d) on the V encoded tokens: V · D · d
    * decoder: l layers on all P + 1 tokens
    * prediction head (d→p²C) on all P + 1 tokens (the CLS row is dropped after it): (P + 1) · d · p²C
    The loss (a squared error per pixel) and the unshuffle gather are element-wise and not counted.

    Worked example, ViT-B/16 at 224 px with the paper's decoder (d = 512, l = 8, i = 2048) at r = 0.75: P = 196,
    V = 1 + 49 = 50; encoder 12 · (12·50·768² + 2·50²·768) = 12 · 357.7 M = 4.293 G; patch 196·768·768 = 0.116 G;
    decoder embedding 50·768·512 = 0.020 G; decoder 8 · (197·512·1536 + 2·197²·512 + 197·512² + 2·197·512·2048)
    = 8 · 659.4 M = 5.276 G; prediction 197·512·768 = 0.077 G -> 9.78 GMACs, 56% of the ViT-B/16 classifier's
    17.56 G: the encoder on a quarter of the tokens costs a quarter, and the decoder (9% of the encoder's cost per
    token, the paper's "<10%") now runs on four times as many tokens.
    """
    img_h, img_w = as_pair(config.image_size if image_size is None else image_size)
    patch_h, patch_w = as_pair(config.patch_size)
    channels, hidden = int(config.num_channels), int(config.hidden_size)
    num_patches = (img_h // patch_h) * (img_w // patch_w)
    visible = 1 + mae_visible_patches(num_patches, float(config.mask_ratio))
    decoder_hidden = int(config.decoder_hidden_size)
    pixels_per_patch = channels * patch_h * patch_w

    patch_embed = num_patches * pixels_per_patch * hidden
    encoder = int(config.num_hidden_layers) * layer_macs(visible, hidden, int(config.intermediate_size))
    decoder_embed = visible * hidden * decoder_hidden
    decoder = int(config.decoder_num_hidden_layers) * layer_macs(
        num_patches + 1, decoder_hidden, int(config.decoder_intermediate_size)
    )
    prediction = (num_patches + 1) * decoder_hidden * pixels_per_patch
    return patch_embed + encoder + decoder_embed + decoder + prediction


def is_deit(config) -> bool:
    """A DeiT config: the recipe's `--distillation_token` student (two tokens before the patches, two heads)."""
    return getattr(config, "model_type", None) == "deit"


def extra_tokens(config) -> int:
    """Tokens besides the patches: CLS, and DeiT's distillation token."""
    return 2 if is_deit(config) else 1


def classifier_heads(config) -> int:
    """Linear heads on the sequence: ViT's one on CLS; DeiT's two (`DeiTForImageClassificationWithTeacher`, the
    DeiT the recipe builds; a one-head `DeiTForImageClassification` is over-counted by D x num_labels MACs)."""
    return 2 if is_deit(config) else 1


def tokens_per_image(config, image_size: int | tuple[int, int] | None = None) -> int | None:
    """Sequence length of a ViT or DeiT (patches + extra tokens; an MAE's decoder sequence, patches + CLS); None for
    any other model (a CNN)."""
    if not (has_vit_formula(config) or is_mae(config)):
        return None
    img_h, img_w = as_pair(config.image_size if image_size is None else image_size)
    patch_h, patch_w = as_pair(config.patch_size)
    return (img_h // patch_h) * (img_w // patch_w) + extra_tokens(config)


def vit_train_flops_per_image(config, image_size: int | tuple[int, int] | None = None) -> int:
    """Training FLOPs (forward + backward) for ONE image: 3 × forward FLOPs = 3 × 2 × forward MACs.

    (Backward ≈ 2 × forward, Kaplan et al. 2020; activation recomputation is deliberately not counted.)
    """
    return 3 * 2 * vit_forward_macs_per_image(config, image_size=image_size)


def counted_forward_flops_per_image(config, image_size: int | tuple[int, int] | None = None) -> int:
    """Forward FLOPs of ONE image through the config's AutoModelForImageClassification, counted by torch's
    `FlopCounterMode` (2 per multiply-accumulate of each convolution and matmul; norms, activations and pooling not
    counted, as the ViT formula leaves them out). For models without a formula here, i.e. CNNs. The model is built
    on the meta device: no memory, no compute, only shapes, and whole under ZeRO-3 too (`zero3_init_off`).
    resnet-tiny-cpu at 32 px: 8.44 MFLOPs. `image_size` overrides `config.image_size` (a teacher runs at the
    student's size)."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForImageClassification

    from hf_vit_scaling.models.zero3 import zero3_init_off

    height, width = as_pair(config.image_size if image_size is None else image_size)
    with torch.device("meta"), zero3_init_off():
        model = AutoModelForImageClassification.from_config(config).eval()  # batch norm: one image
    with FlopCounterMode(display=False) as counter:
        model(pixel_values=torch.zeros(1, config.num_channels, height, width, device="meta"))
    return int(counter.get_total_flops())


def has_patches(config) -> bool:
    return getattr(config, "patch_size", None) is not None


def has_vit_formula(config) -> bool:
    """A ViT or DeiT, which `vit_forward_macs_per_image` counts; other models with a `patch_size` (ConvNeXt's stem,
    Swin's windows) are counted by `counted_forward_flops_per_image`."""
    return has_patches(config) and getattr(config, "model_type", "vit") in ("vit", "deit")


def forward_flops_per_image(config, image_size: int | tuple[int, int] | None = None) -> int:
    """Forward FLOPs of ONE image: 2 x the ViT formula for a ViT or DeiT, counted by FlopCounterMode for anything
    else (a CNN). `image_size` overrides the config's: a distillation teacher runs at the student's size
    (resnet-tiny-cpu at 16 px: 2.11 MFLOPs, a quarter of its 8.44 at 32 px, as convolution FLOPs scale with the
    pixels)."""
    if has_vit_formula(config):
        return 2 * vit_forward_macs_per_image(config, image_size=image_size)
    if is_mae(config):
        return 2 * mae_forward_macs_per_image(config, image_size=image_size)
    return counted_forward_flops_per_image(config, image_size=image_size)


def forward_macs_per_image(config) -> int:
    """The ViT formula for a ViT or DeiT; half the counted FLOPs for a CNN."""
    return forward_flops_per_image(config) // 2


def train_flops_per_image(config) -> int:
    """Training FLOPs of one image, forward + backward = 3 x forward (as `vit_train_flops_per_image`)."""
    return 3 * 2 * forward_macs_per_image(config)


# Dense (no structured sparsity) peak TFLOP/s per GPU, per precision. "bf16"/"fp16" are the tensor-core rates
# with FP32 accumulation (what torch autocast / HF Trainer uses), "tf32" the TF32 tensor-core rate, "fp32" the
# plain CUDA-core FP32 rate. None = the GPU has no such mode. Where a datasheet quotes "with sparsity" figures
# the dense figure is half of it. Keys are matched as whole words against torch.cuda.get_device_name(), longest
# key first (see lookup_peak_tflops).
PEAK_TFLOPS: dict[str, dict[str, float | None]] = {
    # Tesla T4 datasheet (Turing): mixed-precision FP16/FP32 65 TFLOPS, FP32 8.1. No bf16, no tf32.
    "T4": {"bf16": None, "fp16": 65.0, "tf32": None, "fp32": 8.1},
    # GTX 1070 (Pascal GP104) spec page: FP32 6.5 TFLOPS. GP104 has no tensor cores and native FP16 runs at
    # 1/64 rate; cuBLAS computes fp16 GEMMs with FP32 math there, so the FP32 peak is the fp16 ceiling too.
    "GTX 1070": {"bf16": None, "fp16": 6.5, "tf32": None, "fp32": 6.5},
    # Tesla P4 datasheet (Pascal GP104): FP32 5.5 TFLOPS (INT8 22 TOPS); fp16 as for the GTX 1070 above.
    "P4": {"bf16": None, "fp16": 5.5, "tf32": None, "fp32": 5.5},
    # V100 datasheet (Volta): SXM2 tensor 125 / FP32 15.7; PCIe tensor 112 / FP32 14; V100S PCIe 130 / 16.4.
    "V100": {"bf16": None, "fp16": 125.0, "tf32": None, "fp32": 15.7},
    "V100-PCIE": {"bf16": None, "fp16": 112.0, "tf32": None, "fp32": 14.0},
    "V100S": {"bf16": None, "fp16": 130.0, "tf32": None, "fp32": 16.4},
    # NVIDIA Ampere GA102 whitepaper, RTX 3070 column: FP16/BF16 tensor with FP32 accumulate 40.6 (81.2 sparse),
    # TF32 tensor 20.3 (40.6 sparse), FP32 20.3. (GeForce runs FP32-accumulate tensor math at half rate.)
    "RTX 3070": {"bf16": 40.6, "fp16": 40.6, "tf32": 20.3, "fp32": 20.3},
    # RTX A4500 datasheet: FP32 23.7 TFLOPS, tensor 189.2 TFLOPS with sparsity → 94.6 dense fp16/bf16, TF32 47.3.
    "RTX A4500": {"bf16": 94.6, "fp16": 94.6, "tf32": 47.3, "fp32": 23.7},
    # A10 datasheet: FP32 31.2, TF32 62.5 | 125*, BF16 125 | 250*, FP16 125 | 250* (* = sparsity).
    "A10": {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2},
    # A40 datasheet: FP32 37.4, TF32 74.8 | 149.6*, BF16 149.7 | 299.4*, FP16 149.7 | 299.4*.
    "A40": {"bf16": 149.7, "fp16": 149.7, "tf32": 74.8, "fp32": 37.4},
    # L4 datasheet (Ada): FP32 30.3, TF32 120*, BF16 242*, FP16 242* (all "with sparsity") → dense 60 / 121 / 121.
    "L4": {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3},
    # A100 datasheet (SXM4 and PCIe, 40 and 80 GB alike): FP32 19.5, TF32 156 | 312*, BF16/FP16 312 | 624*.
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    # NVIDIA H100 Tensor Core GPU Architecture whitepaper, Table 2 (dense): H100 SXM5 BF16/FP16 989.4,
    # TF32 494.7, FP32 66.9; H100 PCIe BF16/FP16 756.5, TF32 378.5, FP32 51.2.
    "H100": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "H100 PCIe": {"bf16": 756.5, "fp16": 756.5, "tf32": 378.5, "fp32": 51.2},
    # H100 NVL / H200 NVL datasheets (per GPU): FP32 60, TF32 835*, BF16/FP16 1671* → dense 417.5 / 835.5.
    "H100 NVL": {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0},
    "H200 NVL": {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0},
    # H200 (SXM) datasheet: same compute as H100 SXM (FP32 67, TF32 989*, BF16/FP16 1979*); more/faster HBM.
    "H200": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
}

PRECISIONS = ("bf16", "fp16", "tf32", "fp32")


def _key_pattern(key: str) -> re.Pattern[str]:
    """Case-insensitive whole-word pattern for a table key.

    The key must not be glued to a letter or digit on either side, so "A10" does not match "A100" or "A10G",
    "A40" does not match "RTX A4000", "L4" does not match "L40S", "H200" does not match "GH200" and "T4" does not
    match "RTX A4500". Spaces in a key also match "-" or "_" ("H100 PCIe" ~ "H100-PCIe").
    """
    body = r"[\s_-]+".join(re.escape(part) for part in key.split())
    return re.compile(rf"(?<![a-z0-9]){body}(?![a-z0-9])", re.IGNORECASE)


# Longest key first, so the most specific entry wins ("H100 PCIe" before "H100", "V100-PCIE" before "V100").
_KEY_PATTERNS = [(key, _key_pattern(key)) for key in sorted(PEAK_TFLOPS, key=len, reverse=True)]


def match_device_key(device_name: str) -> str | None:
    """Return the ``PEAK_TFLOPS`` key matching a ``torch.cuda.get_device_name()`` string, or None if unknown."""
    for key, pattern in _KEY_PATTERNS:
        if pattern.search(device_name):
            return key
    return None


def lookup_peak_tflops(device_name: str, precision: str) -> float | None:
    """Dense peak TFLOP/s of ``device_name`` (e.g. "NVIDIA H100 80GB HBM3") in ``precision``.

    ``precision`` is one of "bf16", "fp16", "tf32", "fp32" (case-insensitive). Returns None for an unknown
    device, an unknown precision, or a precision the GPU does not support (e.g. bf16 on a T4).
    """
    key = match_device_key(device_name)
    if key is None:
        return None
    return PEAK_TFLOPS[key].get(precision.lower())


# Peak memory (HBM / GDDR) bandwidth per GPU in GB/s (10^9 bytes/s), from the same datasheets as PEAK_TFLOPS, keyed
# like it; where one name covers boards with different memories, one entry per memory size in GiB as the board is
# sold (recipes/plan.py's --gpu_memory). The planner's non-GEMM time is bytes / this (`planning.speed`).
HBM_GBPS: dict[str, dict[int, float]] = {
    "T4": {16: 320.0},  # T4 datasheet: 16 GB GDDR6, 320+ GB/s
    "GTX 1070": {8: 256.0},  # GTX 1070 spec page: 8 GB GDDR5, 256 GB/s
    "P4": {8: 192.0},  # Tesla P4 datasheet: 8 GB GDDR5, 192 GB/s
    "V100": {16: 900.0, 32: 900.0},  # V100 datasheet: SXM2 and PCIe 900 GB/s (HBM2)
    "V100-PCIE": {16: 900.0, 32: 900.0},
    "V100S": {32: 1134.0},  # V100S PCIe: 1,134 GB/s
    "RTX 3070": {8: 448.0},  # GA102 whitepaper / RTX 3070 spec: 8 GB GDDR6, 448 GB/s
    "RTX A4500": {20: 640.0},  # RTX A4500 datasheet: 20 GB GDDR6, 640 GB/s
    "A10": {24: 600.0},  # A10 datasheet: 24 GB GDDR6, 600 GB/s
    "A40": {48: 696.0},  # A40 datasheet: 48 GB GDDR6, 696 GB/s
    "L4": {24: 300.0},  # L4 datasheet: 24 GB GDDR6, 300 GB/s
    # A100 datasheet: 40GB (PCIe and SXM) HBM2 1,555 GB/s; 80GB SXM HBM2e 2,039 GB/s (80GB PCIe: 1,935). The table's
    # "A100" names both form factors; 80 GB is taken as the SXM board, which DGX A100 nodes carry.
    "A100": {40: 1555.0, 80: 2039.0},
    # H100 datasheet: H100 SXM 80 GB HBM3 3.35 TB/s; H100 PCIe 80 GB HBM2e 2 TB/s; H100 NVL 94 GB HBM3 3.9 TB/s.
    "H100": {80: 3350.0},
    "H100 PCIe": {80: 2000.0},
    "H100 NVL": {94: 3900.0},
    # H200 datasheet: 141 GB HBM3e, 4.8 TB/s (SXM and NVL).
    "H200 NVL": {141: 4800.0},
    "H200": {141: 4800.0},
}


def lookup_hbm_gbps(device_name: str, memory_gib: float | None = None) -> float | None:
    """Datasheet memory bandwidth (GB/s) of ``device_name``, for the board with ``memory_gib`` GiB where the name
    covers several (A100 40 GB: 1,555; 80 GB: 2,039). A memory size the table lacks gets the slowest of the name's
    boards, so the estimate errs towards slower. None for an unknown device."""
    key = match_device_key(device_name)
    if key is None or key not in HBM_GBPS:
        return None
    boards = HBM_GBPS[key]
    if memory_gib is not None and round(memory_gib) in boards:
        return boards[round(memory_gib)]
    return min(boards.values())


def _synchronize(device: torch.device) -> None:
    """Wait for queued kernels so wall-clock timings cover the work (CPU ops are already synchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def measure_matmul_peak_tflops(
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    size: int = 1024,
    seconds: float = 0.3,
) -> float:
    """Achieved TFLOP/s of repeated ``size × size`` matmuls on ``device`` for about ``seconds``.

    Used as a practical "peak" for the CPU or for GPUs missing from ``PEAK_TFLOPS``. Each matmul is 2·n³ FLOPs.
    Note that on CUDA an fp32 probe measures the TF32 rate if ``torch.backends.cuda.matmul.allow_tf32`` is set.
    """
    device = torch.device(device)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    out = torch.empty(size, size, device=device, dtype=dtype)

    with torch.no_grad():
        # Warm-up: library handles, kernel selection and thread-pool start-up are not measured.
        torch.matmul(a, b, out=out)
        _synchronize(device)

        # Run in batches with one synchronise per batch (a per-matmul sync would dominate small GPU matmuls);
        # the batch doubles while a batch is short, so the overshoot past `seconds` stays small.
        iterations = 0
        batch = 1
        start = time.perf_counter()
        elapsed = 0.0
        while elapsed < seconds:
            batch_start = time.perf_counter()
            for _ in range(batch):
                torch.matmul(a, b, out=out)
            _synchronize(device)
            now = time.perf_counter()
            iterations += batch
            elapsed = now - start
            if now - batch_start < seconds / 20:
                batch *= 2

    tflops = 2 * size**3 * iterations / max(elapsed, 1e-9) / 1e12
    if not math.isfinite(tflops) or tflops <= 0:
        raise RuntimeError(f"matmul probe produced an invalid throughput: {tflops!r}")
    return tflops


def precision_name(bf16: bool, fp16: bool, tf32: bool | None) -> str:
    """Map HF ``TrainingArguments`` precision flags to a ``PEAK_TFLOPS`` precision key.

    ``tf32=None`` (Trainer's default) leaves PyTorch's default in place, which keeps TF32 matmuls off, so it maps
    to "fp32".
    """
    if bf16 and fp16:
        raise ValueError("bf16 and fp16 are mutually exclusive")
    if bf16:
        return "bf16"
    if fp16:
        return "fp16"
    if tf32:
        return "tf32"
    return "fp32"


def mfu(achieved_tflops: float, peak_tflops: float | None) -> float | None:
    """Model FLOPs utilisation as a fraction (0.4 = 40%); None when the peak is unknown (None) or not positive."""
    if peak_tflops is None or peak_tflops <= 0:
        return None
    return achieved_tflops / peak_tflops


def device_peak_tflops(
    device: torch.device, precision: str, user_peak: float | None = None
) -> tuple[float | None, str]:
    """(dense peak TFLOP/s per device, where it came from): the user's value, the GPU table, a CPU matmul probe, or
    (None, "none") for an unknown accelerator."""
    if user_peak:
        return user_peak, "user"
    if device.type == "cuda":
        peak = lookup_peak_tflops(torch.cuda.get_device_name(device), precision)
        return (peak, "table") if peak else (None, "none")
    if device.type == "cpu":
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        return measure_matmul_peak_tflops("cpu", dtype=dtype), "matmul-probe"
    return None, "none"
