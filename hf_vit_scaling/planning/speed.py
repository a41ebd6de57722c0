"""Step time per engine: compute plus the bytes each rank moves, the epoch time built from it, and the
achievable TFLOP/s calibrated from a measured epoch.

Speed
-----
Compute: images × training FLOPs per image (`flops.train_flops_per_image`: the ViT or the MAE formula, ×4/3 with
gradient checkpointing, which reruns the forward; + a distillation teacher's forward FLOPs, no backward) ÷ an
achievable TFLOP/s that the caller states, plus the layers' non-GEMM work (LayerNorms, activations, residual adds,
bias gradients: `non_gemm_bytes_per_image`), which is bound by memory bandwidth: its bytes ÷ the GPU's datasheet HBM
bandwidth (`PlanSettings.hbm_gbps`; off for a measured TFLOP/s, which already includes it). Communication: bytes
each rank sends per step ÷ the link's bus bandwidth, with the ring-algorithm volumes of NCCL's performance notes
(nccl-tests `doc/PERFORMANCE.md`): all-reduce 2(N-1)/N × bytes, all-gather and reduce-scatter (N-1)/N × bytes. A
ring that spans nodes is as fast as its slowest link, so the bandwidth is the node's network when there is more than
one node.
Compute and communication are added (no overlap assumed), so the step time is an upper-bound-style estimate.
`communication_terms` lists every collective of a step: what it moves, the bytes each rank sends, the link class it
crosses (intra-node: NVLink/PCIe; a ring across nodes: the slower of that and the network; inter-node only, for
HSDP's replica all-reduce) and the bandwidth assumed for it.

Engine overhead: the host-side work DeepSpeed does per step around the GPU's (`engine_overhead_s`): each gradient
bucket flush (a flatten, a collective launch, stream waits, a copy back) and, under ZeRO-3, each module gather (its
hooks, the all-gather launch, the release), counted from the model's tensors and the ds_config's sizes as the recipe
resolves them, at per-operation costs fitted to the one GPU run (benchmarks/README.md, "Engine overhead").

Notation as in `memory`: Ψ parameters, N ranks, p the bytes of a parameter in the engine's working dtype. The
bandwidths are inputs (`memory.PlanSettings`); the assumed ones are `shapes.INTERCONNECTS` and `shapes.NETWORKS`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hf_vit_scaling.models.flops import train_flops_per_image
from hf_vit_scaling.parallel.deepspeed_config import bucket_flushes
from hf_vit_scaling.planning.memory import PlanSettings, zero3_gathered_parameters, zero3_persistence, zero_buckets
from hf_vit_scaling.planning.shapes import HSDP, MaeShape, VitShape, bytes_per_element


@dataclass
class SpeedEstimate:
    """One optimizer step on one rank: `seconds` and `bytes` by part (compute: the GEMMs and attention core at the
    achievable TFLOP/s; non_gemm: the layers' memory-bound work at HBM bandwidth; collectives, sequence_parallel,
    host_transfer, cpu_optimizer), their sum `step_s`, the global throughput, and the bandwidth the collectives
    were given."""

    seconds: dict[str, float]
    bytes: dict[str, int]
    step_s: float
    images_per_s: float
    bandwidth_gbps: float
    terms: list[CommTerm] = field(default_factory=list)

    @property
    def device_s(self) -> float:
        """The GPU's own work in a step: GEMM time + non-GEMM (memory-bound) time."""
        return self.seconds["compute"] + self.seconds["non_gemm"]

    @property
    def communication_s(self) -> float:
        """The step less the GPU's own work: collectives, all-to-alls, host transfers, CPU Adam."""
        return self.step_s - self.device_s

    @property
    def communication_bound(self) -> bool:
        """Whether the step spends at least as long communicating as computing (no overlap assumed)."""
        return self.communication_s >= self.device_s


@dataclass
class CommTerm:
    """One collective of a step on one rank: `payload_bytes` is the tensor it works on, `bytes_per_rank` what each
    rank sends (NCCL's bus volume), over `link` at `gbps` GB/s."""

    collective: str  # all-reduce | all-gather | reduce-scatter
    what: str
    payload_bytes: int
    bytes_per_rank: int
    link: str  # intra-node | ring across nodes | inter-node
    gbps: float

    @property
    def seconds(self) -> float:
        return self.bytes_per_rank / (self.gbps * 1e9)


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
    p = bytes_per_element(precision)
    if engine == "ddp":
        return int(2 * ring * 4 * num_parameters)
    if engine in ("zero1", "zero2", "zero2_offload"):
        return int(2 * ring * p * num_parameters)
    regathered = num_parameters if regathered_parameters is None else regathered_parameters
    return int(ring * p * (2 * num_parameters + regathered))


def ring_link(settings: PlanSettings) -> tuple[str, float]:
    """The link class and bus bandwidth of a ring over every rank: the node's GPU link on one node; across nodes a
    ring is as fast as its slowest link (the network, or NVLink if the network is faster)."""
    if settings.nodes == 1:
        return "intra-node", settings.intra_node_gbps
    return "ring across nodes", min(settings.intra_node_gbps, settings.inter_node_gbps)


def communication_terms(
    engine: str, settings: PlanSettings, regathered_parameters: int | None = None
) -> list[CommTerm]:
    """The data-parallel collectives of one step, each with its bytes per rank, link class and bandwidth.

    Ring volumes (nccl-tests doc/PERFORMANCE.md): all-reduce of S bytes sends 2(N-1)/N x S per rank, all-gather and
    reduce-scatter (N-1)/N x S, S the whole (unsharded) tensor. Ψ parameters, p bytes a weight, N ranks:
    * DDP: all-reduce of the fp32 gradients, S = 4Ψ (torch DDP reduces in the gradients' dtype; 2(N-1)/N x 4Ψ:
      ViT-g/14, Ψ = 1.01e9, on 16 x 8 GPUs: 2 x 127/128 x 4.04 GB = 8.0 GB per rank per step);
    * ZeRO-1/2 (and offload): reduce-scatter of the p-byte gradients + all-gather of the updated p-byte weights, the
      same 2(N-1)/N x pΨ as an all-reduce (Rajbhandari et al. 2020, arXiv 1910.02054, §7.2.1);
    * ZeRO-3 / FSDP2: all-gather of the weights for forward and again for backward, reduce-scatter of the gradients:
      3(N-1)/N x pΨ (§7.2.2); DeepSpeed's ZeRO-3 skips the backward gather of what it kept gathered
      (`regathered_parameters`);
    * HSDP, g GPUs a node and r nodes: FSDP2's three collectives inside the node, 3(g-1)/g x pΨ over NVLink, then an
      all-reduce of each rank's gradient shard across the r replicas, 2(r-1)/r x pΨ/g, over the network, which the
      node's g GPUs share (each gets inter_node_gbps / g): the node sends the whole gradient once, in p bytes.
    """
    shape = settings.shape
    psi, n, p = shape.num_parameters, settings.world_size, bytes_per_element(settings.precision)
    if n == 1:
        return []
    dtype = "fp32" if p == 4 else settings.precision
    if engine == HSDP and settings.nodes > 1:
        g, r = settings.gpus_per_node, settings.nodes
        inside = [] if g == 1 else [
            CommTerm("all-gather", f"{dtype} weights, forward", p * psi, int((g - 1) / g * p * psi), "intra-node",
                     settings.intra_node_gbps),
            CommTerm("all-gather", f"{dtype} weights, backward", p * psi, int((g - 1) / g * p * psi), "intra-node",
                     settings.intra_node_gbps),
            CommTerm("reduce-scatter", f"{dtype} gradients", p * psi, int((g - 1) / g * p * psi), "intra-node",
                     settings.intra_node_gbps),
        ]  # fmt: skip
        shard = math.ceil(psi / g) * p
        across = CommTerm(
            "all-reduce",
            f"{dtype} gradient shard across replicas",
            shard,
            int(2 * (r - 1) / r * shard),
            "inter-node",
            settings.inter_node_gbps / g,
        )
        return [*inside, across]
    link, gbps = ring_link(settings)
    ring = (n - 1) / n
    if engine == "ddp":
        return [CommTerm("all-reduce", "fp32 gradients", 4 * psi, int(2 * ring * 4 * psi), link, gbps)]
    if engine in ("zero1", "zero2", "zero2_offload"):
        return [
            CommTerm("reduce-scatter", f"{dtype} gradients", p * psi, int(ring * p * psi), link, gbps),
            CommTerm("all-gather", f"{dtype} updated weights", p * psi, int(ring * p * psi), link, gbps),
        ]
    regathered = psi if regathered_parameters is None else regathered_parameters
    return [
        CommTerm("all-gather", f"{dtype} weights, forward", p * psi, int(ring * p * psi), link, gbps),
        CommTerm("all-gather", f"{dtype} weights, backward", p * regathered, int(ring * p * regathered), link, gbps),
        CommTerm("reduce-scatter", f"{dtype} gradients", p * psi, int(ring * p * psi), link, gbps),
    ]


def layer_stacks(shape: VitShape) -> list[tuple[int, int, int, int, str]]:
    """The transformer stacks one image runs through, as (layers, tokens, width, MLP width, MLP kind): a ViT's
    layers on its tokens; an MAE's encoder on the visible tokens and its (GELU) decoder on every token."""
    if isinstance(shape, MaeShape):
        return [
            (shape.num_hidden_layers, shape.visible_tokens, shape.hidden_size, shape.intermediate_size, shape.mlp),
            (shape.decoder_num_hidden_layers, shape.all_tokens, shape.decoder_hidden_size,
             shape.decoder_intermediate_size, "gelu"),
        ]  # fmt: skip
    return [(shape.num_hidden_layers, shape.tokens, shape.hidden_size, shape.intermediate_size, shape.mlp)]


def layer_non_gemm_elements(tokens: int, width: int, inter: int, mlp: str) -> dict[str, int]:
    """Elements one pre-norm layer's non-GEMM kernels read + write for one image, forward and backward.

    Each element-wise or normalising kernel streams its inputs from HBM and its output back; it does a handful of
    FLOPs per element, far below what it would take to be compute bound, so its time is its bytes ÷ bandwidth. With
    e = s·h elements of a token-by-width activation and m = s·I of the MLP's hidden one (s tokens):

    * forward: 2 LayerNorms (read x, write y: 2e each), 2 residual adds (read 2, write 1: 3e each), the activation:
      GELU reads and writes m (2m), SwiGLU reads its two halves and writes the product (3m): 10e + 2m | 3m;
    * backward: 2 LayerNorm backwards (read dy and x, write dx: 3e each), the 2 residual streams' gradient sums (3e
      each), the activation's backward: GELU reads dy and its input, writes dx (3m), SwiGLU reads dy and both
      halves, writes both gradients (5m); the bias gradients, a reduction over tokens of each projection's output
      gradient (q, k, v, o and the MLP's output: 5e; the MLP's input projection: m, SwiGLU's fused one 2m):
      17e + 4m | 7m.

    Not counted: bias adds in forward (they run in the GEMM's epilogue: torch's addmm via cuBLASLt, Megatron's
    fused bias-GELU and bias-dropout-add); dropout (the planner's shapes have none); the attention core, which is
    assumed to be a fused kernel (FlashAttention, as SDPA on GPUs and NeMo use, the planner's memory model too): the
    s x s scores and softmax never reach HBM and its QKᵀ and ·V FLOPs are in the GEMM term; the patch embedding,
    final LayerNorm, head and loss (once per image, not per layer); layout copies; the optimizer step.
    """
    e, m = tokens * width, tokens * inter
    swiglu = mlp == "swiglu"
    forward = 2 * 2 * e + 2 * 3 * e + (3 if swiglu else 2) * m
    backward = 2 * 3 * e + 2 * 3 * e + (5 if swiglu else 3) * m + 5 * e + (2 if swiglu else 1) * m
    return {"forward": forward, "backward": backward}


def non_gemm_bytes_per_image(shape: VitShape, precision: str, gradient_checkpointing: bool = False) -> int:
    """HBM bytes one training image's non-GEMM kernels move (`layer_non_gemm_elements` over every layer), in the
    working dtype's p bytes an element (bf16/fp16: 2, fp32: 4); full activation checkpointing runs each forward
    kernel once more. Selective recomputation adds nothing here: it reruns the fused attention core only.

    Worked example, ViT-B/16 at 224 px, batch 1, bf16: e = 197 x 768 = 151,296, m = 197 x 3,072 = 605,184; a layer
    moves (10e + 2m) + (17e + 4m) = 27e + 6m = 7,716,096 elements, 12 layers x 2 bytes = 185,186,304 bytes (185 MB):
    91 us at the A100 80GB's 2,039 GB/s, against 105.38 GFLOP / (312 x 0.4 TFLOP/s) = 844 us of GEMMs (+10.8%).
    """
    elements = 0
    for layers, tokens, width, inter, mlp in layer_stacks(shape):
        per_layer = layer_non_gemm_elements(tokens, width, inter, mlp)
        passes = per_layer["forward"] * (2 if gradient_checkpointing else 1) + per_layer["backward"]
        elements += layers * passes
    return elements * bytes_per_element(precision)


# Per-operation host costs in seconds, fitted to the one H200 run (benchmarks/results/gpu_check_h200.json): ZeRO-2's
# step over the plain Trainer's / its 147 bucket flushes; ZeRO-3's over ZeRO-2's / its 198 gathers. The step times and
# the fit: docs/planner.md, "DeepSpeed's host-side work per step".
FLUSH_S = 0.64e-3
GATHER_S = 0.59e-3
ZERO3_MODULES_PER_LAYER = {
    "leaf": 1,
    "submodules": 8,
}  # a leaf ViTLayer is gathered whole; else q, k, v, o, 2 MLP, 2 LN


def zero3_gathers(engine: str, settings: PlanSettings) -> int:
    """Module gathers a ZeRO-3 step runs (forward and backward): none where every tensor is under the persistence
    threshold the run keeps (`memory.zero3_persistence`: the recipe's resolution keeps every tensor whole on one
    process with the weights on it, and on several every tensor of a model whose largest one is under DeepSpeed's
    1e5 default); else one per leaf module twice, the encoder layer a leaf (the recipe's `leaf_module`) unless the
    ds_config names its own (then its 8 modules with parameters), plus the embeddings, the final norm and the head."""
    zero = settings.ds_configs.get(engine, {}).get("zero_optimization", {})
    largest = max(n for sizes in settings.shape.parameter_sizes().values() for n in sizes)
    if largest <= zero3_persistence(engine, settings):
        return 0
    per_layer = ZERO3_MODULES_PER_LAYER["submodules" if "leaf_module" in zero else "leaf"]
    return 2 * (settings.shape.num_hidden_layers * per_layer + 3)


def engine_overhead_s(engine: str, settings: PlanSettings) -> float:
    """Host-side seconds a step of `engine` spends on bucket flushes and ZeRO-3 gathers (see the module docstring):
    0 for DDP and FSDP2 (their reductions are C++ hooks), flushes x FLUSH_S for ZeRO-1/2, + `zero3_gathers` x
    GATHER_S for ZeRO-3."""
    if not engine.startswith("zero"):
        return 0.0
    numels = [n for sizes in settings.shape.parameter_sizes().values() for n in sizes][::-1]
    seconds = bucket_flushes(numels, zero_buckets(engine, settings)[0]) * FLUSH_S
    if engine.startswith("zero3"):
        seconds += zero3_gathers(engine, settings) * GATHER_S
    return seconds


def engine_speed(engine: str, settings: PlanSettings) -> SpeedEstimate:
    """Step-time estimate: compute + collectives + sequence-parallel all-to-alls + host transfers + CPU Adam."""
    shape, sp = settings.shape, settings.sequence_parallel_size
    p = bytes_per_element(settings.precision)
    flops = settings.per_device_batch * train_flops_per_image(shape) / sp
    if settings.gradient_checkpointing:
        flops *= 4 / 3  # one more forward per step: 3 → 4 forward-equivalents
    elif settings.selective_checkpointing:
        # The attention core's forward once more (Korthikanti et al. 2022, arXiv 2205.05198, §5): QKᵀ and ·V, 2 x s²h
        # multiply-accumulates a layer, 4s²h FLOPs (ViT-g/14: 4 x 257² x 1408 x 40 = 14.9 GFLOP an image, 0.9%).
        core = 4 * shape.tokens**2 * shape.hidden_size * shape.num_hidden_layers
        flops += settings.per_device_batch * core / sp
    if settings.teacher is not None:  # its forward on the micro-batch (sequence parallelism is refused beside it)
        flops += settings.per_device_batch * settings.teacher.forward_flops_per_image
    compute_s = flops / (settings.achievable_tflops * 1e12)
    # Step compute time = GEMM FLOPs / achievable FLOP/s + non-GEMM bytes / HBM bandwidth (a teacher's forward: its
    # FLOPs only). Under sequence parallelism each rank holds s/N of the tokens, so 1/N of those bytes.
    hbm_bytes, non_gemm_s = 0, 0.0
    if settings.hbm_gbps is not None:
        per_image = non_gemm_bytes_per_image(shape, settings.precision, settings.gradient_checkpointing)
        hbm_bytes = settings.per_device_batch * per_image // sp
        non_gemm_s = hbm_bytes / (settings.hbm_gbps * 1e9)

    bandwidth = ring_link(settings)[1]
    regathered = None
    if engine.startswith("zero3"):
        regathered = shape.num_parameters - zero3_gathered_parameters(shape)
    terms = communication_terms(engine, settings, regathered)
    collective = sum(term.bytes_per_rank for term in terms)
    collective_s = sum(term.seconds for term in terms)

    # Ulysses: per layer 4 all-to-alls forward (Q, K, V in, output back) and 4 backward, each moving (N-1)/N of the
    # rank's b × s/N × h activations (Jacobs et al. 2023, "DeepSpeed Ulysses", §3.2).
    sp_bytes = 0
    if sp > 1:
        local = settings.per_device_batch * math.ceil(shape.tokens / sp) * shape.hidden_size * p
        sp_bytes = int(8 * shape.num_hidden_layers * (sp - 1) / sp * local)
    sp_link = settings.intra_node_gbps if sp <= settings.gpus_per_node else bandwidth
    sp_s = sp_bytes / (sp_link * 1e9)

    shard = math.ceil(shape.num_parameters / settings.shard_group(engine))
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
        "non_gemm": non_gemm_s,
        "collectives": collective_s,
        "sequence_parallel": sp_s,
        "host_transfer": host_s,
        "cpu_optimizer": cpu_opt_s,
        "engine_overhead": engine_overhead_s(engine, settings),
    }
    step_s = sum(seconds.values())
    moved = {
        "non_gemm": hbm_bytes,
        "collectives": collective,
        "sequence_parallel": sp_bytes,
        "host_transfer": host_bytes,
    }
    images = settings.per_device_batch * settings.world_size / sp
    return SpeedEstimate(seconds, moved, step_s, images / step_s, bandwidth, terms)


def epoch_seconds(engine: str, settings: PlanSettings, train_images: int) -> dict[str, float]:
    """Estimated epoch time: each data-parallel rank gets ceil(images / replicas) images (PyTorch's
    DistributedSampler pads to equal shares), computes them at the settings' TFLOP/s and HBM bandwidth and pays
    the per-step communication once per step, the last partial step included."""
    replicas = settings.world_size // settings.sequence_parallel_size
    per_rank = math.ceil(train_images / replicas)
    steps = math.ceil(per_rank / settings.per_device_batch)
    speed = engine_speed(engine, settings)
    compute = per_rank / settings.per_device_batch * speed.device_s
    communication = steps * speed.communication_s
    return {"steps": steps, "compute_s": compute, "communication_s": communication, "epoch_s": compute + communication}


def achievable_tflops_from_epoch(
    shape: VitShape, train_images: int, epoch_s: float, gradient_checkpointing: bool = False
) -> float:
    """The TFLOP/s one GPU achieved, from a measured single-GPU epoch (no communication in it): the planner's
    calibration input. The study's T4 epoch (arXiv 2602.21081): 50,000 images x 105.4 GFLOP / 1,817.65 s = 2.90
    TFLOP/s."""
    flops = train_images * train_flops_per_image(shape) * (4 / 3 if gradient_checkpointing else 1)
    return flops / epoch_s / 1e12
