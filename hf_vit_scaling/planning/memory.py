"""Plan a ViT training run before launching it: memory per rank and step time for each engine the project runs.

Engines (one code path each, as the recipe runs them): plain DDP (the Trainer without DeepSpeed), DeepSpeed ZeRO-1,
ZeRO-2, ZeRO-2 with the optimizer offloaded to the CPU, ZeRO-3, ZeRO-3 with parameters and optimizer offloaded, and
FSDP2 full sharding (the Trainer's `--fsdp --fsdp_config fsdp_configs/fsdp2.json`).

Memory per rank, in five parts plus a margin
--------------------------------------------
Notation: Ψ parameters, N ranks (data-parallel world; the ZeRO/FSDP sharding degree), p the bytes of a
parameter in the engine's working dtype (2 for bf16 DeepSpeed/FSDP, 4 for fp32).

* **Model states** follow Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
  Models", §3.1 and Figure 1: mixed-precision Adam holds 2Ψ (16-bit weights) + 2Ψ (16-bit gradients) + KΨ with K = 12
  (fp32 master weights, momentum, variance); ZeRO-1 shards the KΨ, ZeRO-2 also the gradients, ZeRO-3 also the
  weights. The code here counts what each implementation actually allocates, which differs from the paper in places
  that are stated next to each engine (DeepSpeed builds an fp32 copy of the gradient partition for the optimizer step
  and keeps an fp32 master copy even in fp32 training; torch DDP keeps flat communication buckets beside the
  gradients; ZeRO-3 keeps weights gathered through the forward pass).
* **Activations**: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", §4.1,
  Eq. (1): a transformer layer stores sbh(34 + 5as/h) bytes (s tokens, b batch, h hidden, a heads; 2-byte activations
  and 1-byte dropout masks). `layer_activation_elements` adapts it to Hugging Face's ViT (see there).
* **Buffers**: communication buckets, gathered (unsharded) parameters, autocast weight copies, the step's temporaries.
* **Margin**: a fraction of the device kept free for the CUDA context, NCCL's own buffers and allocator
  fragmentation, none of which torch's allocator reports as tensors.

Gradients and activations are not live at the same time at their peaks: activations are freed layer by layer during
backward while gradients appear, and unsharded gradients live until the optimizer step. So the peak is
``static + max(forward, backward end, step)``: static = what lives between steps (weights, optimizer states,
persistent buffers); forward = activations + what is held for them (gathered weights, the first gradient buckets);
backward end = the gradients + the first layer's activations; step = gradients + the optimizer step's temporaries.
Each part's own size is reported, so the parts do not add up to the peak. `engine_memory` says which engine holds
what when; 2-process CPU runs of every engine agree with it within 4% (docs/planner.md).

Speed
-----
Compute: images × training FLOPs per image (`flops.vit_train_flops_per_image`, ×4/3 with gradient checkpointing,
which reruns the forward) ÷ an achievable TFLOP/s that the caller states. Communication: bytes each rank sends per
step ÷ the link's bus bandwidth, with the ring-algorithm volumes of NCCL's performance notes (nccl-tests
`doc/PERFORMANCE.md`): all-reduce 2(N-1)/N × bytes, all-gather and reduce-scatter (N-1)/N × bytes. A ring that spans
nodes is as fast as its slowest link, so the bandwidth is the node's network when there is more than one node.
Compute and communication are added (no overlap assumed), so the step time is an upper-bound-style estimate.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass, field, replace

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.models.flops import vit_train_flops_per_image

GiB = 1024**3

ENGINES = ("ddp", "zero1", "zero2", "zero2_offload", "zero3", "zero3_offload", "fsdp2")
ENGINE_NAMES = {
    "ddp": "DDP",
    "zero1": "ZeRO-1",
    "zero2": "ZeRO-2",
    "zero2_offload": "ZeRO-2 + optimizer offload",
    "zero3": "ZeRO-3",
    "zero3_offload": "ZeRO-3 + param/optimizer offload",
    "fsdp2": "FSDP2 full shard",
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
}
PRECISIONS = ("bf16", "fp32")


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
}

# DeepSpeed defaults the Hugging Face integration fills in for "auto" (transformers integrations/deepspeed.py):
# reduce_bucket_size = h², stage3_prefetch_bucket_size = 0.9·h², stage3_param_persistence_threshold = 10·h.
# DeepSpeed's own default stage3_max_reuse_distance is 1e9 parameters (deepspeed/runtime/zero/config.py).
ZERO3_MAX_REUSE_DISTANCE = 1_000_000_000
DEEPSPEED_DEFAULT_REDUCE_BUCKET = 500_000_000
PERSISTENCE_THRESHOLD_FACTOR = 10


# --------------------------------------------------------------------------- model shape and parameter counts


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

    @property
    def tokens(self) -> int:
        """Patches + CLS: ViT-B/16 at 224 px has 14 × 14 + 1 = 197."""
        return (self.image_size // self.patch_size) ** 2 + 1

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
            "embeddings": [h, self.tokens * h],  # cls_token, position_embeddings
            "patch_embeddings": [c * p * p * h, h],  # Conv2d weight, bias
        }
        for i in range(self.num_hidden_layers):
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                groups[f"layer{i}.{proj}"] = [h * h, h]
            groups[f"layer{i}.layernorm_before"] = [h, h]
            groups[f"layer{i}.layernorm_after"] = [h, h]
            groups[f"layer{i}.fc1"] = [h * inter, inter]
            groups[f"layer{i}.fc2"] = [inter * h, h]
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
        """One ViTLayer: 4(h² + h) + 2·2h + 2·h·I + I + h (ViT-B: 7,087,872)."""
        h, inter = self.hidden_size, self.intermediate_size
        return 4 * (h * h + h) + 4 * h + 2 * h * inter + inter + h

    def zero3_persistent_parameters(self) -> int:
        """Parameters ZeRO-3 never partitions: tensors of at most `stage3_param_persistence_threshold` (= 10·h with
        "auto") elements stay whole on every rank: biases, LayerNorms, the CLS token, a small classifier."""
        threshold = PERSISTENCE_THRESHOLD_FACTOR * self.hidden_size
        return sum(n for sizes in self.parameter_sizes().values() for n in sizes if n <= threshold)


def vit_shape(
    preset: dict, image_size: int | None = None, patch_size: int | None = None, num_labels: int = 1000
) -> VitShape:
    """A `VitShape` from a `models.MODEL_PRESETS` entry with optional overrides (as the recipe applies them)."""
    values = dict(preset)
    values["image_size"] = image_size or values["image_size"]
    values["patch_size"] = patch_size or values["patch_size"]
    return VitShape(num_labels=num_labels, **values)


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
    * the MLP width is `intermediate_size` I rather than a fixed 4h.

    In elements: LayerNorm inputs 2sbh, LayerNorm outputs (QKV and MLP inputs) 2sbh, Q, K, V 3sbh, O sbh, GELU input
    and output 2sbI; plus fp32 statistics: LayerNorm mean and rstd 2 × 2sb, log-sum-exp asb. With I = 4h that is
    16sbh elements, 32sbh bytes at 2 bytes: Korthikanti's 34sbh without the two dropout masks, and no 5as/h term.
    (Checked against the tensors autograd saves for a real HF ViT layer: tests/unit/test_planner.py.)
    With Ulysses sequence parallelism each rank keeps ceil(s / N) tokens (the sequence is padded to a multiple of N).
    """
    s = math.ceil(shape.tokens / sequence_parallel_size)
    sbh = s * batch * shape.hidden_size
    sbi = s * batch * shape.intermediate_size
    return {
        "residual": 2 * sbh,  # LayerNorm inputs: the layer input and the residual after attention
        "normed": 2 * sbh,  # LayerNorm outputs kept by q/k/v_proj and fc1
        "qkv": 3 * sbh,
        "attention_output": sbh,  # SDPA's output O, also o_proj's input
        "mlp": 2 * sbi,  # GELU input (fc1 output) and GELU output (fc2 input)
        "fp32_statistics": 4 * s * batch + shape.num_attention_heads * s * batch,
    }


def activation_bytes(
    shape: VitShape,
    batch: int,
    precision: str,
    gradient_checkpointing: bool = False,
    sequence_parallel_size: int = 1,
    autocast: bool = False,
) -> dict[str, int]:
    """Activation memory of one rank at its peak (the start of backward), in bytes, by part.

    `autocast`: torch autocast (plain DDP with --bf16) keeps fp32 weights, so the residual stream (embeddings + fp32
    position table, and every `x + residual`) stays fp32 while matmul inputs are bf16 copies.
    Gradient checkpointing (transformers checkpoints each ViTLayer) keeps only each layer's input, and during
    backward one layer is recomputed at a time: L·sbh + one full layer.
    The backward working set is the gradient flowing through one layer's MLP: 2sbI + 2sbh elements.
    """
    element = 2 if precision == "bf16" else 4
    residual_element = 4 if autocast else element
    per_layer = layer_activation_elements(shape, batch, sequence_parallel_size)
    layer = (
        per_layer["residual"] * residual_element
        + (per_layer["normed"] + per_layer["qkv"] + per_layer["attention_output"] + per_layer["mlp"]) * element
        + per_layer["fp32_statistics"] * 4
    )
    s_local = math.ceil(shape.tokens / sequence_parallel_size)
    sbh = s_local * batch * shape.hidden_size
    sbi = s_local * batch * shape.intermediate_size
    layers = shape.num_hidden_layers
    if gradient_checkpointing:
        stored = layers * sbh * residual_element + layer  # each layer's input + one layer recomputed
    else:
        stored = layers * layer
    # The pixels the patch convolution keeps; the final LayerNorm's input, statistics and output on the full
    # sequence (gathered before it under sequence parallelism; the classifier keeps the CLS slice, a view that keeps
    # the whole output alive); the logits.
    pixels = batch * shape.num_channels * shape.image_size**2 * (4 if autocast else element)
    tokens = shape.tokens * batch
    head = 2 * tokens * shape.hidden_size * residual_element + 2 * tokens * 4 + batch * shape.num_labels * 4
    working = (2 * sbi + 2 * sbh) * element
    return {
        "layers": stored,
        "one_layer": layer,
        "pixels": pixels,
        "embeddings_and_head": pixels + head,
        "backward_working_set": working,
        "total": stored + pixels + head + working,
    }


# --------------------------------------------------------------------------- memory per engine


@dataclass
class MemoryEstimate:
    """Bytes per rank on the device.

    `parts`: each part's own largest size (parameters, gradients, optimizer_states, activations, buffers).
    `phases`: "static" lives between steps; "forward", "backward_end" and "step" are what comes on top of it at the
    three moments that can be the peak, so peak = static + max(forward, backward_end, step).
    `host_bytes_per_rank` is CPU memory (offload variants)."""

    parts: dict[str, int]
    phases: dict[str, int]
    peak: int
    margin: int
    usable: int
    fits: bool
    host_bytes_per_rank: int
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class PlanSettings:
    """Everything a plan depends on besides the engine. `ds_configs` maps an engine to its DeepSpeed JSON (the
    project's ds_configs/ files); bucket sizes are read from it, with DeepSpeed's defaults for missing keys."""

    shape: VitShape
    per_device_batch: int
    gpus_per_node: int
    nodes: int = 1
    gpu_memory_bytes: int = 40 * GiB
    precision: str = "bf16"
    gradient_checkpointing: bool = False
    sequence_parallel_size: int = 1
    memory_margin: float = 0.10
    achievable_tflops: float = 125.0
    intra_node_gbps: float = INTERCONNECTS["nvlink3"]
    inter_node_gbps: float = NETWORKS["ib-hdr"]
    host_link_gbps: float = INTERCONNECTS["pcie4"]
    cpu_adam_gparams_per_s: float = 1.0
    ds_configs: dict = field(default_factory=dict, hash=False, compare=False)

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    def with_batch(self, batch: int) -> PlanSettings:
        return replace(self, per_device_batch=batch)


def model_state_bytes(engine: str, num_parameters: int, world_size: int, precision: str) -> dict[str, int]:
    """Model-state bytes per rank, as each engine allocates them (device, and host for offload).

    Returns parameters, gradients, optimizer_states (fp32 master weights + Adam moments), fp32_gradient_copy
    (DeepSpeed's fp32 gradient partition, built for the optimizer step and freed after it) and host (CPU bytes per
    rank). With Ψ, N and p as in the module docstring:

    * DDP (torch DDP; the Trainer keeps fp32 weights and uses autocast for bf16): 4Ψ weights, 4Ψ gradients,
      8Ψ AdamW moments. Its flat gradient buckets (another 4Ψ) are buffers, see `engine_memory`.
    * ZeRO-1: pΨ weights, pΨ gradients (all of them, until the optimizer step), (4 + 8)Ψ/N fp32 master and moments,
      + 4Ψ/N fp32 gradient partition at the step. DeepSpeed clones the fp32 master partition even for fp32 training.
    * ZeRO-2: pΨ + pΨ/N gradients + 12Ψ/N + 4Ψ/N at the step. In bf16: 2Ψ + 18Ψ/N, DeepSpeed's own estimate
      (`estimate_zero2_model_states_mem_needs`: "2 = params_16bit, 18 = 2_grads_16bit + 4_grads_32bit +
      4_params_32bit + 8_optimizer_states_32bit").
    * ZeRO-3: pΨ/N + pΨ/N + (4 + 8)Ψ/N + 4Ψ/N at the step = 20Ψ/N in bf16. In fp32 too the master partition is a
      separate copy: stage3.py means to reuse the weight partition when the dtypes match, but compares a
      `torch.device` with a device-name string, which is never equal (measured: 5 × 4Ψ/N bytes live between steps).
      DeepSpeed's `estimate_zero3_model_states_mem_needs` counts 18Ψ/N (its ZeRO-2 list, without the 16-bit
      weight partition).
    * Offload variants: the optimizer's parts (master, moments, fp32 gradients) live in host memory; ZeRO-3 offload
      also the weight and gradient partitions. The device keeps pΨ (ZeRO-2) or no partition at all (ZeRO-3).
    * FSDP2: sharded fp32 weights, gradients and moments: (4 + 4 + 8)Ψ/N; compute-dtype copies of the layer in use
      are made at all-gather time (buffers).
    """
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}")
    psi, n = num_parameters, world_size
    p = 2 if precision == "bf16" else 4
    shard = math.ceil(psi / n)
    master, moments = 4 * shard, 8 * shard
    states = {"parameters": 0, "gradients": 0, "optimizer_states": 0, "fp32_gradient_copy": 0, "host": 0}
    if engine == "ddp":
        states.update(parameters=4 * psi, gradients=4 * psi, optimizer_states=8 * psi)
    elif engine == "zero1":
        states.update(
            parameters=p * psi, gradients=p * psi, optimizer_states=master + moments, fp32_gradient_copy=4 * shard
        )
    elif engine in ("zero2", "zero3"):
        states.update(
            parameters=p * (psi if engine == "zero2" else shard),
            gradients=p * shard,
            optimizer_states=master + moments,
            fp32_gradient_copy=4 * shard,
        )
    elif engine == "zero2_offload":
        # Host: fp32 master + moments + fp32 gradient partition + a 16-bit staging copy of the partition.
        states.update(parameters=p * psi, host=master + moments + 4 * shard + p * shard)
    elif engine == "zero3_offload":
        states.update(host=p * shard + p * shard + master + moments + 4 * shard)
    elif engine == "fsdp2":
        states.update(parameters=4 * shard, gradients=4 * shard, optimizer_states=moments)
    return states


def zero3_gathered_parameters(shape: VitShape, max_reuse_distance: int = ZERO3_MAX_REUSE_DISTANCE) -> int:
    """Parameters ZeRO-3 holds gathered (whole) at the end of the forward pass, from the second step on.

    From the second step DeepSpeed follows the recorded module trace, and after a module's forward it keeps a
    parameter gathered if the parameter is used again within the next `stage3_max_reuse_distance` parameters of the
    trace (partitioned_param_coordinator.py, `__params_to_release`). A layer's next use is its own backward, after
    the rest of the forward and the backward of the layers above it: about 2 × the parameters above it. With the
    default distance of 1e9 every layer of a model under about 500 M parameters stays gathered until its backward,
    so the forward ends with the whole model gathered (measured on 2 ranks: ViT-B/16 in fp32 had 4Ψ bytes of
    gathered weights on top of its partitions); for larger models only the top layers within the distance.
    """
    layers = shape.num_hidden_layers
    per_layer = shape.layer_parameters
    kept = shape.num_parameters - layers * per_layer
    for i in range(layers):
        above = (layers - 1 - i) * per_layer
        if 2 * above + per_layer < max_reuse_distance:
            kept += per_layer
    return min(kept, shape.num_parameters)


def zero_buckets(engine: str, settings: PlanSettings) -> tuple[int, int]:
    """(elements per gradient bucket, number of buckets) DeepSpeed allocates, read from the engine's ds_config.

    `reduce_bucket_size` "auto" is h² (the Hugging Face integration fills it); a missing key is DeepSpeed's default
    5e8 elements, which DeepSpeed allocates whole (`torch.empty(reduce_bucket_size)`) however small the model: 2 GB
    in fp32 (measured: a 2,000 MB allocation in the first backward hook). `overlap_comm` (default: on for stage 3
    only) doubles the buckets.
    """
    zero = settings.ds_configs.get(engine, {}).get("zero_optimization", {})
    size = zero.get("reduce_bucket_size", DEEPSPEED_DEFAULT_REDUCE_BUCKET)
    elements = settings.shape.hidden_size**2 if size == "auto" else int(float(size))
    overlap = zero.get("overlap_comm", engine.startswith("zero3"))
    return elements, 2 if overlap else 1


def engine_memory(engine: str, settings: PlanSettings) -> MemoryEstimate:
    """Peak device bytes per rank for one engine: static + max(forward phase, backward end, step phase).

    What lives where was checked against 2-process CPU runs (benchmarks/planner_memory.py, docs/planner.md):
    * between steps: weights, optimizer states and persistent buffers (torch DDP's gradient buckets, ZeRO-3's
      gradient partition and buckets); gradients are freed by `zero_grad(set_to_none=True)` (DDP, FSDP2) or
      rebuilt each backward (ZeRO-1/2's buckets and gradient partition);
    * forward phase (up to the start of backward): activations, plus weights the engine holds whole for the
      forward (ZeRO-3's gathered weights, FSDP2's unsharded layers, autocast's bf16 weight copies) and what the
      first gradient hook allocates (ZeRO-1/2 buckets and gradient partition);
    * backward end: the gradients that exist whole or in buckets, while the first layer's activations (recomputed
      under checkpointing), the pixels and one layer's working set are still live;
    * step phase: gradients + the optimizer step's temporaries (DeepSpeed's fp32 gradient partition).
    """
    shape = settings.shape
    psi, n = shape.num_parameters, settings.world_size
    p = 2 if settings.precision == "bf16" else 4
    shard = math.ceil(psi / n)
    states = model_state_bytes(engine, psi, n, settings.precision)
    autocast = engine == "ddp" and settings.precision == "bf16"
    act = activation_bytes(
        shape,
        settings.per_device_batch,
        settings.precision,
        settings.gradient_checkpointing,
        settings.sequence_parallel_size,
        autocast=autocast,
    )
    first_layer = act["one_layer"] + act["pixels"] + act["backward_working_set"]
    notes: list[str] = []
    static_grads = static_buffers = 0
    # What comes on top of `static` at each moment, as (whole weights, gradients, buffers); activations are added
    # below.
    forward, backward_end, step = [0, 0, 0], [0, 0, 0], [0, 0, 0]

    if engine == "ddp":
        # torch DDP's Reducer keeps flat buckets holding a copy of every gradient (accelerate leaves
        # gradient_as_bucket_view=False); the .grad tensors themselves exist from backward to zero_grad.
        static_buffers = 4 * psi
        backward_end[1] = step[1] = states["gradients"]
        if autocast:
            forward[2] = 2 * psi  # bf16 weight copies autocast makes, kept by the matmuls for backward
            notes.append("bf16 via autocast: fp32 weights, bf16 weight copies during forward/backward")
    elif engine in ("zero1", "zero2", "zero2_offload"):
        elements, count = zero_buckets(engine, settings)
        bucket = elements * count * p
        # The buckets (and ZeRO-2's contiguous gradient partition) are allocated by the first gradient hook, when
        # nearly all activations are still live: they count at the start of backward ("forward") too.
        if engine == "zero1":
            # Gradients go into the bucket as they appear (views into it); what does not fit waits as .grad. The
            # reduction flattens them once more: bucket + pΨ at the end of backward (measured with the 5e8 default).
            forward[2] = bucket
            backward_end[1:] = [p * psi, max(bucket, p * psi) + min(bucket, p * psi) - p * psi]
            step[1:] = [p * shard, states["fp32_gradient_copy"]]
        elif engine == "zero2":
            forward[1:] = backward_end[1:] = [p * shard, bucket]
            step[1:] = [p * shard, bucket + states["fp32_gradient_copy"]]
        else:
            # Gradients leave the device bucket by bucket, through a staging tensor as large as the largest parameter.
            forward[2] = backward_end[2] = bucket + shape.largest_module_parameters * p
        if elements == DEEPSPEED_DEFAULT_REDUCE_BUCKET:
            notes.append(
                f"no reduce_bucket_size in its ds_config: DeepSpeed's default bucket of 5e8 elements is allocated "
                f'whole ({count} x {elements * p / GiB:.2f} GiB); "auto" would make it h² = {shape.hidden_size**2:,}'
            )
    elif engine in ("zero3", "zero3_offload"):
        elements, count = zero_buckets(engine, settings)
        gathered = zero3_gathered_parameters(shape) * p
        static_grads = states["gradients"]
        static_buffers = elements * count * p + shape.zero3_persistent_parameters() * p
        forward[0] = gathered
        if engine == "zero3":
            # The step flattens the 16-bit gradient partition and converts it to fp32 (two copies when p = 2).
            step[2] = states["fp32_gradient_copy"] + (p * shard if p != 4 else 0)
        notes.append(
            f"keeps {gathered / GiB:.2f} GiB of weights gathered through forward (stage3_max_reuse_distance 1e9)"
        )
    elif engine == "fsdp2":
        # Unsharded weights in the compute dtype: the root's own parameters and the final LayerNorm (not resharded
        # after forward), the current layer and the prefetched next one; in backward also one layer's unsharded
        # gradients before their reduce-scatter. Sharded gradients exist from backward to zero_grad.
        root = (psi - shape.num_hidden_layers * shape.layer_parameters) * p
        forward[0] = root + 2 * shape.layer_parameters * p
        backward_end[:] = [root + 2 * shape.layer_parameters * p, states["gradients"], shape.layer_parameters * p]
        step[1] = states["gradients"]

    if states["host"]:
        per_node = states["host"] * settings.gpus_per_node
        notes.append(f"host memory {states['host'] / GiB:.2f} GiB per rank, {per_node / GiB:.1f} GiB per node")
    parts = {
        "parameters": states["parameters"] + max(forward[0], backward_end[0], step[0]),
        "gradients": static_grads + max(forward[1], backward_end[1], step[1]),
        "optimizer_states": states["optimizer_states"],
        "activations": act["total"],
        "buffers": static_buffers + max(forward[2], backward_end[2], step[2]),
    }
    phases = {
        "static": states["parameters"] + static_grads + states["optimizer_states"] + static_buffers,
        "forward": act["total"] + sum(forward),
        "backward_end": first_layer + sum(backward_end),
        "step": sum(step),
    }
    peak = phases["static"] + max(phases["forward"], phases["backward_end"], phases["step"])
    margin = int(settings.memory_margin * settings.gpu_memory_bytes)
    usable = settings.gpu_memory_bytes - margin
    return MemoryEstimate(parts, phases, peak, margin, usable, peak <= usable, states["host"], notes)


def largest_batch(engine: str, settings: PlanSettings, limit: int = 1 << 16) -> int:
    """The largest per-device batch whose peak fits in the usable memory (0 when not even 1 fits).

    Peak memory never decreases with the batch (activations grow linearly, the rest is constant), so a binary search
    over [1, limit] finds the boundary.
    """
    if not engine_memory(engine, settings.with_batch(1)).fits:
        return 0
    lo, hi = 1, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if engine_memory(engine, settings.with_batch(mid)).fits:
            lo = mid
        else:
            hi = mid - 1
    return lo


# --------------------------------------------------------------------------- speed


@dataclass
class SpeedEstimate:
    """One optimizer step on one rank: `seconds` and `bytes` by part (compute, collectives, sequence_parallel,
    host_transfer, cpu_optimizer), their sum `step_s`, the global throughput, and the bandwidth the collectives
    were given."""

    seconds: dict[str, float]
    bytes: dict[str, int]
    step_s: float
    images_per_s: float
    bandwidth_gbps: float


def collective_bytes_per_rank(
    engine: str, num_parameters: int, world_size: int, precision: str, regathered_parameters: int | None = None
) -> int:
    """Bytes each rank sends per step for the data-parallel collectives (ring algorithms, bus-bandwidth volumes).

    * DDP: all-reduce of the fp32 gradients: 2(N-1)/N × 4Ψ (torch DDP reduces gradients in their fp32 dtype
      even under autocast).
    * ZeRO-1/2 (and -offload): reduce-scatter of the p-byte gradients + all-gather of the updated p-byte weights:
      2(N-1)/N × pΨ, the same volume as data parallelism (Rajbhandari et al. 2020, §7.2.1).
    * ZeRO-3 / FSDP2: the weights are all-gathered for forward and again for backward, and gradients
      reduce-scattered: 3(N-1)/N × pΨ, 1.5× data parallelism (Rajbhandari et al. 2020, §7.2.2).
      `regathered_parameters` (default Ψ) is what backward must gather again: DeepSpeed's ZeRO-3 skips the weights
      it kept gathered since forward (`zero3_gathered_parameters`).
    """
    n = world_size
    if n == 1:
        return 0
    ring = (n - 1) / n
    p = 2 if precision == "bf16" else 4
    if engine == "ddp":
        return int(2 * ring * 4 * num_parameters)
    if engine in ("zero1", "zero2", "zero2_offload"):
        return int(2 * ring * p * num_parameters)
    regathered = num_parameters if regathered_parameters is None else regathered_parameters
    return int(ring * p * (2 * num_parameters + regathered))


def engine_speed(engine: str, settings: PlanSettings) -> SpeedEstimate:
    """Step-time estimate: compute + collectives + sequence-parallel all-to-alls + host transfers + CPU Adam."""
    shape, sp = settings.shape, settings.sequence_parallel_size
    p = 2 if settings.precision == "bf16" else 4
    flops = settings.per_device_batch * vit_train_flops_per_image(shape) / sp
    if settings.gradient_checkpointing:
        flops *= 4 / 3  # one more forward per step: 3 → 4 forward-equivalents
    compute_s = flops / (settings.achievable_tflops * 1e12)

    bandwidth = (
        settings.intra_node_gbps if settings.nodes == 1 else min(settings.intra_node_gbps, settings.inter_node_gbps)
    )
    regathered = None
    if engine.startswith("zero3"):
        regathered = shape.num_parameters - zero3_gathered_parameters(shape)
    collective = collective_bytes_per_rank(
        engine, shape.num_parameters, settings.world_size, settings.precision, regathered
    )
    collective_s = collective / (bandwidth * 1e9)

    # Ulysses: per layer 4 all-to-alls forward (Q, K, V in, output back) and 4 backward, each moving (N-1)/N of the
    # rank's b × s/N × h activations (Jacobs et al. 2023, "DeepSpeed Ulysses", §3.2).
    sp_bytes = 0
    if sp > 1:
        local = settings.per_device_batch * math.ceil(shape.tokens / sp) * shape.hidden_size * p
        sp_bytes = int(8 * shape.num_hidden_layers * (sp - 1) / sp * local)
    sp_link = settings.intra_node_gbps if sp <= settings.gpus_per_node else bandwidth
    sp_s = sp_bytes / (sp_link * 1e9)

    shard = math.ceil(shape.num_parameters / settings.world_size)
    host_bytes, cpu_opt_s = 0, 0.0
    if engine == "zero2_offload":
        host_bytes = 2 * p * shard  # gradient partition to the host, updated weights back
    elif engine == "zero3_offload":
        # Weights in for forward (and again for backward, those not kept gathered), gradients out.
        host_bytes = 2 * p * shard + p * math.ceil(regathered / settings.world_size)
    if engine.endswith("_offload"):
        cpu_opt_s = shard / (settings.cpu_adam_gparams_per_s * 1e9)
    host_s = host_bytes / (settings.host_link_gbps * 1e9)

    seconds = {
        "compute": compute_s,
        "collectives": collective_s,
        "sequence_parallel": sp_s,
        "host_transfer": host_s,
        "cpu_optimizer": cpu_opt_s,
    }
    step_s = sum(seconds.values())
    moved = {"collectives": collective, "sequence_parallel": sp_bytes, "host_transfer": host_bytes}
    images = settings.per_device_batch * settings.world_size / sp
    return SpeedEstimate(seconds, moved, step_s, images / step_s, bandwidth)


def epoch_seconds(engine: str, settings: PlanSettings, train_images: int) -> dict[str, float]:
    """Estimated epoch time: each data-parallel rank gets ceil(images / replicas) images (PyTorch's
    DistributedSampler pads to equal shares), computes them at the settings' TFLOP/s and pays the per-step
    communication once per step, the last partial step included."""
    replicas = settings.world_size // settings.sequence_parallel_size
    per_rank = math.ceil(train_images / replicas)
    steps = math.ceil(per_rank / settings.per_device_batch)
    speed = engine_speed(engine, settings)
    compute = per_rank / settings.per_device_batch * speed.seconds["compute"]
    communication = steps * (speed.step_s - speed.seconds["compute"])
    return {"steps": steps, "compute_s": compute, "communication_s": communication, "epoch_s": compute + communication}


def achievable_tflops_from_epoch(
    shape: VitShape, train_images: int, epoch_s: float, gradient_checkpointing: bool = False
) -> float:
    """The TFLOP/s one GPU achieved, from a measured single-GPU epoch (no communication in it): the planner's
    calibration input. The study's T4 epoch: 50,000 images x 105.4 GFLOP / 1,817.65 s = 2.90 TFLOP/s."""
    flops = train_images * vit_train_flops_per_image(shape) * (4 / 3 if gradient_checkpointing else 1)
    return flops / epoch_s / 1e12


# --------------------------------------------------------------------------- plan and recommendation


@dataclass
class EngineOption:
    engine: str
    name: str
    flags: str
    memory: MemoryEstimate
    speed: SpeedEstimate
    max_batch: int


@dataclass
class Plan:
    settings: PlanSettings
    options: list[EngineOption]
    recommended: str | None
    reason: str

    def to_dict(self) -> dict:
        settings = asdict(self.settings)
        settings.pop("ds_configs")
        settings["shape"]["tokens"] = self.settings.shape.tokens
        settings["shape"]["num_parameters"] = self.settings.shape.num_parameters
        settings["world_size"] = self.settings.world_size
        settings["train_flops_per_image"] = vit_train_flops_per_image(self.settings.shape)
        return {
            "version": 1,
            "settings": settings,
            "options": [asdict(option) for option in self.options],
            "recommended": self.recommended,
            "reason": self.reason,
            "notes": [
                "Estimates, not measurements. Step time = compute + communication with no overlap; bandwidths, "
                "achievable TFLOP/s and CPU Adam speed are stated inputs (assumptions unless you measured them).",
                "Peak memory = static + max(forward phase, step phase); the margin is kept free for the CUDA "
                "context, NCCL buffers and allocator fragmentation.",
            ],
        }


def recommend(options: list[EngineOption]) -> tuple[str | None, str]:
    """The engine to use and why.

    Plain data parallelism first whenever it fits: it has the least communication and no sharding machinery, and
    DeepSpeed's maintainers advise ZeRO only when the model or batch does not fit (deepspeedai/DeepSpeed issue 1436,
    a maintainer: "ZeRO is best used when model size ... or batch size will not [fit in] the available GPU memory.
    The techniques that ZeRO uses to reduce memory consumption do make backward() slower"; the Transformers
    multi-GPU guide likewise lists DDP first when the model fits on one GPU). Otherwise the fastest
    estimated option that fits (ties go to the simpler engine, in `ENGINES` order). When nothing fits at the
    requested batch: the option that fits the largest batch, with gradient accumulation to keep the global batch.
    """
    by_engine = {o.engine: o for o in options}
    if "ddp" in by_engine and by_engine["ddp"].memory.fits:
        ddp = by_engine["ddp"]
        return "ddp", (
            f"DDP fits ({ddp.memory.peak / GiB:.1f} of {ddp.memory.usable / GiB:.1f} GiB usable): plain "
            "data parallelism has the least communication; ZeRO/FSDP only save memory you do not need "
            "(DeepSpeed's maintainers advise ZeRO when the model or batch does not fit)."
        )
    fitting = [o for o in options if o.memory.fits]
    if fitting:
        best = min(fitting, key=lambda o: (round(o.speed.step_s, 9), ENGINES.index(o.engine)))
        why_not_ddp = ""
        if "ddp" in by_engine:
            why_not_ddp = (
                f"DDP needs {by_engine['ddp'].memory.peak / GiB:.1f} GiB > "
                f"{by_engine['ddp'].memory.usable / GiB:.1f} GiB usable; "
            )
        return best.engine, (
            f"{why_not_ddp}{best.name} is the fastest option that fits "
            f"({best.speed.step_s:.3f} s/step, {best.memory.peak / GiB:.1f} GiB)."
        )
    best = max(options, key=lambda o: (o.max_batch, -o.speed.step_s), default=None)
    if best is None or best.max_batch == 0:
        return None, (
            "Nothing fits even at batch 1. Fix: --gradient_checkpointing, more GPUs (ZeRO-3/FSDP shard "
            "over them), --sequence_parallel_size for long sequences, bf16, or a smaller model/image."
        )
    return best.engine, (
        f"Nothing fits at the requested batch; {best.name} fits up to {best.max_batch} per device: use "
        "--per_device_train_batch_size with --gradient_accumulation_steps to keep the global batch, "
        "or add --gradient_checkpointing."
    )


def plan(settings: PlanSettings, engines: tuple[str, ...] = ENGINES) -> Plan:
    """Memory, speed and the largest batch for every engine, and the recommendation."""
    options = []
    for engine in engines:
        if settings.sequence_parallel_size > 1 and engine in ("ddp", "fsdp2"):
            continue  # this project's sequence parallelism runs on DeepSpeed's process groups only
        options.append(
            EngineOption(
                engine=engine,
                name=ENGINE_NAMES[engine],
                flags=ENGINE_FLAGS[engine],
                memory=engine_memory(engine, settings),
                speed=engine_speed(engine, settings),
                max_batch=largest_batch(engine, settings),
            )
        )
    recommended, reason = recommend(options)
    return Plan(settings=settings, options=options, recommended=recommended, reason=reason)


# --------------------------------------------------------------------------- inputs and output


_MEMORY_UNITS = {
    "": GiB,
    "g": GiB,
    "gb": GiB,
    "gib": GiB,
    "m": 1024**2,
    "mb": 1024**2,
    "mib": 1024**2,
    "t": 1024**4,
    "tb": 1024**4,
    "tib": 1024**4,
}


def parse_memory_size(text: str, flag: str = "--gpu_memory") -> int:
    """'40GB' → 40 × 2^30 bytes. GPU memory is quoted in binary units (an "A100 40GB" has 40,960 MiB), so GB and GiB
    mean the same here; a bare number is GiB."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _MEMORY_UNITS:
        raise UserInputError(f"{flag} {text!r} is not a memory size. Fix: write it like 40GB, 80GiB or 16384MB.")
    value = float(match.group(1)) * _MEMORY_UNITS[unit]
    if value <= 0:
        raise UserInputError(f"{flag} must be positive, got {text!r}. Fix: give the memory of one GPU, e.g. 40GB.")
    return int(value)


def resolve_bandwidth(text: str, table: dict[str, float], flag: str) -> float:
    """A named link from `table` or a number of GB/s."""
    key = str(text).strip().lower()
    if key in table:
        return table[key]
    try:
        value = float(key)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise UserInputError(
            f"{flag} {text!r} is neither a known link nor a bandwidth. Fix: use one of "
            f"{', '.join(table)}, or a positive number of GB/s."
        )
    return value


def _gib(value: int) -> str:
    return f"{value / GiB:.2f}"


def format_plan(result: Plan) -> str:
    """A table per engine (GiB per rank; step time in seconds), the inputs, and the recommendation."""
    s = result.settings
    shape = s.shape
    lines = [
        f"ViT: {shape.num_parameters / 1e6:.1f} M parameters, {shape.tokens} tokens, "
        f"{vit_train_flops_per_image(shape) / 1e9:.1f} GFLOP per training image; {s.per_device_batch} images per "
        f"device, {s.precision}, gradient checkpointing {'on' if s.gradient_checkpointing else 'off'}, "
        f"sequence parallel {s.sequence_parallel_size}",
        f"Cluster: {s.nodes} node(s) x {s.gpus_per_node} GPUs of {s.gpu_memory_bytes / GiB:.1f} GiB, "
        f"margin {s.memory_margin:.0%}; assumed: {s.achievable_tflops:g} TFLOP/s achievable per GPU, "
        f"{s.intra_node_gbps:g} GB/s in a node, {s.inter_node_gbps:g} GB/s between nodes, "
        f"{s.host_link_gbps:g} GB/s host link, CPU Adam {s.cpu_adam_gparams_per_s:g} G params/s",
        "",
    ]
    header = [
        "engine",
        "params",
        "grads",
        "optim",
        "activ",
        "buffers",
        "peak",
        "usable",
        "fits",
        "max batch",
        "step s",
        "comm s",
        "img/s",
    ]
    rows = []
    for o in result.options:
        parts, speed = o.memory.parts, o.speed
        communication = speed.step_s - speed.seconds["compute"]
        rows.append(
            [o.name, *(_gib(parts[k]) for k in parts), _gib(o.memory.peak), _gib(o.memory.usable)]
            + ["yes" if o.memory.fits else "no", str(o.max_batch), f"{speed.step_s:.3f}", f"{communication:.3f}"]
            + [f"{speed.images_per_s:.0f}"]
        )
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines.append("  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths))))
    for r in rows:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    lines += [
        "",
        "Memory in GiB per rank. peak = static + max(forward phase, backward end, step phase): gradients and "
        "activations are not live together, so the columns do not add up to it.",
        "Step time is an estimate: compute + communication, no overlap (comm s: collectives, host transfers and CPU "
        "Adam); the bandwidths and TFLOP/s above are inputs.",
    ]
    notes = [f"  {o.name}: {note}" for o in result.options for note in o.memory.notes]
    if notes:
        lines += ["Notes:", *notes]
    if result.recommended:
        flags = ENGINE_FLAGS[result.recommended]
        lines += ["", f"Recommended: {ENGINE_NAMES[result.recommended]}  {flags}", f"Why: {result.reason}"]
    else:
        lines += ["", f"Recommended: none. {result.reason}"]
    return "\n".join(lines)
