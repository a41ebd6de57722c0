"""Memory per rank for each engine the project runs (`shapes.ENGINES`), and the largest batch that fits.

Memory per rank, in five parts plus a margin
--------------------------------------------
Notation: Ψ parameters, N ranks (data-parallel world; the ZeRO/FSDP sharding degree), p the bytes of a
parameter in the engine's working dtype (2 for bf16 DeepSpeed/FSDP, 4 for fp32).

* **Model states** follow Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
  Models", §3.1 and Figure 1: mixed-precision Adam holds 2Ψ (16-bit weights) + 2Ψ (16-bit gradients) + KΨ with K = 12
  (fp32 master weights, momentum, variance); ZeRO-1 shards the KΨ, ZeRO-2 also the gradients, ZeRO-3 also the
  weights. The code here counts what each implementation actually allocates, which differs from the paper in places
  that are stated next to each engine (DeepSpeed builds an fp32 copy of the gradient partition for the optimizer step,
  in bf16 through a flattened bf16 copy, and keeps an fp32 master copy even in fp32 training; torch DDP keeps flat
  communication buckets beside the gradients; ZeRO-3 keeps weights gathered through the forward pass).
* **What bf16 keeps, per engine** (the Trainer's --bf16): DeepSpeed (ZeRO-1/2/3 and offload) keeps bf16 weights,
  bf16 gradients and bf16 activations, and the Trainer casts the pixels to bf16; DDP keeps fp32 weights and
  gradients and runs under autocast (bf16 copies of the weights and of every matmul input, an fp32 residual
  stream: `shapes.activation_bytes`); FSDP2 keeps fp32 shards, gradients and moments, all-gathers bf16 weights
  (MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16), accelerate's `set_mixed_precision`), reduces bf16
  gradients and casts them to the fp32 shard, and keeps bf16 activations; its input casts hold the pixels three more
  times through the forward pass (`engine_memory`).
* **Activations**: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", §4.1,
  Eq. (1): a transformer layer stores sbh(34 + 5as/h) bytes (s tokens, b batch, h hidden, a heads; 2-byte activations
  and 1-byte dropout masks). `shapes.layer_activation_elements` adapts it to Hugging Face's ViT (see there).
* **Buffers**: communication buckets, gathered (unsharded) parameters, autocast weight copies, the step's temporaries.
* **Margin**: a fraction of the device kept free for the CUDA context, NCCL's own buffers and allocator
  fragmentation, none of which torch's allocator reports as tensors.
* **A distillation teacher** (`teacher.TeacherShape`, when the plan has one): one whole copy per rank in the run's
  precision under every engine (never partitioned, no gradients, no optimizer states) in the static part, and its
  no_grad forward's peak for one micro-batch on top of the end of the student's forward, when it runs.

Gradients and activations are not live at the same time at their peaks: activations are freed layer by layer during
backward while gradients appear, and unsharded gradients live until the optimizer step. So the peak is
``static + max(forward, backward_start, backward_end, step)``: static = what lives between steps (weights, optimizer
states, persistent buffers); forward = activations at the end of the forward pass + what is held for them (gathered
weights, input copies); backward_start = activations while the top layer's backward runs + the first gradient
buckets; backward_end = the gradients + the first layer's activations; step = gradients + the optimizer step's
temporaries. Each part's own size is reported, so the parts do not add up to the peak. `engine_memory` says which
engine holds what when; 2-process CPU runs of every engine, fp32 and bf16, check it (how closely they agree:
docs/planner.md, "Checked against measured memory").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from hf_vit_scaling.parallel.deepspeed_config import (
    gradient_bucket_elements,
    read_config,
    zero3_persistence_threshold,
)
from hf_vit_scaling.planning.shapes import (
    ALL_ENGINES,
    DEEPSPEED_DEFAULT_REDUCE_BUCKET,
    HSDP,
    INTERCONNECTS,
    NETWORKS,
    ZERO3_MAX_REUSE_DISTANCE,
    GiB,
    VitShape,
    activation_bytes,
    bytes_per_element,
    is_half,
)
from hf_vit_scaling.planning.teacher import TeacherShape


@dataclass
class MemoryEstimate:
    """Bytes per rank on the device.

    `parts`: each part's own largest size (parameters, gradients, optimizer_states, activations, buffers, and with a
    teacher its weights + forward peak).
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
    # Selective recomputation (Korthikanti et al. 2022, arXiv 2205.05198, §5): only the attention core (QKᵀ, softmax,
    # ·V) is recomputed, which drops the 5as²b/h term of their Eq. (1) -> Eq. (2), 34sbh bytes a layer. The planner's
    # activations already hold no s x s tensor (SDPA's fused kernels, `shapes.layer_activation_elements`), so it
    # saves no memory here; it costs the attention core's forward once more (`speed.engine_speed`).
    selective_checkpointing: bool = False
    sequence_parallel_size: int = 1
    memory_margin: float = 0.10
    achievable_tflops: float = 125.0
    # Memory bandwidth for the layers' non-GEMM work (`speed.non_gemm_bytes_per_image`); None leaves that term out, as
    # for a measured --achievable_tflops, whose epoch already spent that time.
    hbm_gbps: float | None = None
    intra_node_gbps: float = INTERCONNECTS["nvlink3"]
    inter_node_gbps: float = NETWORKS["ib-hdr"]
    host_link_gbps: float = INTERCONNECTS["pcie4"]
    cpu_adam_gparams_per_s: float = 1.0
    ds_configs: dict = field(default_factory=dict, hash=False, compare=False)
    teacher: TeacherShape | None = None  # a distillation teacher (recipes/plan.py --teacher_model), or none

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    def shard_group(self, engine: str) -> int:
        """Ranks the model states are sharded over: a node's GPUs under HSDP, every rank otherwise."""
        return self.gpus_per_node if engine == HSDP else self.world_size

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
      + 4Ψ/N fp32 gradient partition at the step (in bf16 made from a flattened bf16 copy, pΨ/N more: see
      `engine_memory`). DeepSpeed clones the fp32 master partition even for fp32 training.
    * ZeRO-2: pΨ + pΨ/N gradients + 12Ψ/N + 4Ψ/N at the step. In bf16: 2Ψ + 18Ψ/N, DeepSpeed's own estimate
      (`estimate_zero2_model_states_mem_needs`: "2 = params_16bit, 18 = 2_grads_16bit + 4_grads_32bit +
      4_params_32bit + 8_optimizer_states_32bit"). That estimate leaves out the flattened bf16 copy of the gradient
      partition the step makes before converting it to fp32 (2Ψ/N, `engine_memory`).
    * ZeRO-3: pΨ/N + pΨ/N + (4 + 8)Ψ/N + 4Ψ/N at the step = 20Ψ/N in bf16. In fp32 too the master partition is a
      separate copy: stage3.py means to reuse the weight partition when the dtypes match, but compares a
      `torch.device` with a device-name string, which is never equal (measured: 5 × 4Ψ/N bytes live between steps).
      DeepSpeed's `estimate_zero3_model_states_mem_needs` counts 18Ψ/N (its ZeRO-2 list, without the 16-bit
      weight partition).
    * Offload variants: the optimizer's parts (master, moments, fp32 gradients) live in host memory; ZeRO-3 offload
      also the weight and gradient partitions. The device keeps pΨ (ZeRO-2) or no partition at all (ZeRO-3).
    * FSDP2: sharded fp32 weights, gradients and moments: (4 + 4 + 8)Ψ/N; compute-dtype copies of the layer in use
      are made at all-gather time (buffers). HSDP is FSDP2 with `world_size` = the shard group (a node's GPUs): the
      same 16Ψ/g on each of the replicas. E.g. a 1 B-parameter model on 8 GPUs a node: 16 x 1e9 / 8 = 2.0 GB per
      GPU however many nodes, where full sharding over 1,024 GPUs holds 16 x 1e9 / 1,024 = 15.6 MB.
    """
    if engine not in ALL_ENGINES:
        raise ValueError(f"unknown engine {engine!r}")
    psi, n = num_parameters, world_size
    p = bytes_per_element(precision)
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
    elif engine in ("fsdp2", HSDP):
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

    `reduce_bucket_size` "auto" or missing is what the recipe resolves from the model's tensors
    (`parallel.deepspeed_config.gradient_bucket_elements`: at most 4 flushes a step on several processes, one bucket
    for every gradient on one); a number in the file is allocated as written, whole (`torch.empty(reduce_bucket_size)`)
    however small the model: DeepSpeed's 5e8 x 4 bytes = 2 GB in fp32 (seen whole in the first backward hook:
    docs/planner.md, "How memory is estimated"). `overlap_comm` (on with several GPUs unless the file says otherwise)
    doubles the buckets.
    """
    zero = settings.ds_configs.get(engine, {}).get("zero_optimization", {})
    size = zero.get("reduce_bucket_size", "auto")
    if size == "auto":
        numels = [n for sizes in settings.shape.parameter_sizes().values() for n in sizes]
        elements = gradient_bucket_elements(numels, settings.world_size)[0]
    else:
        elements = int(float(size))
    overlap = zero.get("overlap_comm", "auto")
    if overlap == "auto":  # missing or "auto": as the recipe resolves it on GPUs, on with several processes
        overlap = settings.world_size > 1
    return elements, 2 if overlap else 1


def zero3_persistence(engine: str, settings: PlanSettings) -> int:
    """The `stage3_param_persistence_threshold` a ZeRO-3 run of `engine` keeps tensors whole under: the number in its
    ds_config, else what the recipe resolves from the model (`deepspeed_config.zero3_persistence_threshold`:
    DeepSpeed's 1e5 default on several GPUs, one above the largest tensor on one GPU with the weights on it)."""
    config = settings.ds_configs.get(engine, {})
    reading = read_config(config)
    if "stage3_param_persistence_threshold" in reading.zero_written:
        return int(float(config["zero_optimization"]["stage3_param_persistence_threshold"]))
    shape = settings.shape
    numels = [n for sizes in shape.parameter_sizes().values() for n in sizes]
    largest_1d = max(shape.hidden_size, shape.intermediate_size, shape.num_labels)  # LayerNorm, MLP or head bias
    return zero3_persistence_threshold(numels, largest_1d, settings.world_size, reading.offload)[0]


def engine_memory(engine: str, settings: PlanSettings) -> MemoryEstimate:
    """Peak device bytes per rank for one engine: static + the largest of four phases.

    What lives where was checked against 2-process CPU runs (benchmarks/planner_memory.py, docs/planner.md):
    * between steps (static): weights, optimizer states and persistent buffers (torch DDP's gradient buckets,
      ZeRO-3's gradient partition and buckets); gradients are freed by `zero_grad(set_to_none=True)` (DDP, FSDP2) or
      rebuilt each backward (ZeRO-1/2's buckets and gradient partition);
    * forward (the end of the forward pass) and backward_start: activations at those two moments
      (`shapes.activation_bytes`), plus weights the engine holds whole (ZeRO-3's gathered weights, FSDP2's unsharded
      layers, autocast's bf16 weight copies) and what the first gradient hook allocates (ZeRO-1/2 buckets and
      gradient partition; counted at both moments, a slight overestimate of the first); FSDP2 in bf16 also holds
      two more copies of the pixels through the forward pass (below);
    * backward_end: the gradients that exist whole or in buckets, while the first layer's activations (recomputed
      under checkpointing), the pixels and one layer's working set are still live;
    * step: gradients + the optimizer step's temporaries (DeepSpeed's flattened and fp32 gradient partitions) + the
      step's fp32 input batch, which the Trainer holds until the optimizer step.
    """
    shape = settings.shape
    psi, n = shape.num_parameters, settings.shard_group(engine)
    p = bytes_per_element(settings.precision)
    shard = math.ceil(psi / n)
    states = model_state_bytes(engine, psi, n, settings.precision)
    autocast = engine == "ddp" and is_half(settings.precision)
    act = activation_bytes(
        shape,
        settings.per_device_batch,
        settings.precision,
        settings.gradient_checkpointing,
        settings.sequence_parallel_size,
        autocast=autocast,
    )
    first_layer = act["one_layer"] + act["pixels"] + act["backward_working_set"]
    # DeepSpeed's optimizer step flattens the gradient partition (`self.flatten(self.averaged_gradients[i])`, a new
    # tensor) and converts it to fp32 (`.to(fp32)`): in bf16 both copies live at once beside the gradients
    # themselves; in fp32 `.to` returns the flattened tensor itself. stage_1_and_2.py `step`, stage3.py
    # `_prepare_fp32_grad_for_sub_group`.
    flattened_copy = p * shard if p != 4 else 0
    notes: list[str] = []
    static_grads = static_buffers = 0
    forward_only = 0  # activations held through the forward pass only (FSDP2's input copies in bf16)
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
            # The step frees the gradients outside this rank's partition, then flattens and converts its own:
            # pΨ/N gradients + pΨ/N flattened (bf16 only) + 4Ψ/N fp32.
            forward[2] = bucket
            backward_end[1:] = [p * psi, max(bucket, p * psi) + min(bucket, p * psi) - p * psi]
            step[1:] = [p * shard, flattened_copy + states["fp32_gradient_copy"]]
        elif engine == "zero2":
            # The step: the contiguous gradient partition (`grads_in_partition`, pΨ/N) + its flattened copy (bf16
            # only, pΨ/N) + the fp32 copy (4Ψ/N) = 8Ψ/N in bf16 (measured for ViT-S/16: docs/planner.md, "How memory
            # is estimated"), 8Ψ/N in fp32 too (4 + 4).
            forward[1:] = backward_end[1:] = [p * shard, bucket]
            step[1:] = [p * shard, bucket + flattened_copy + states["fp32_gradient_copy"]]
        else:
            # Gradients leave the device bucket by bucket, through a staging tensor as large as the largest parameter.
            forward[2] = backward_end[2] = bucket + shape.largest_module_parameters * p
        if elements >= DEEPSPEED_DEFAULT_REDUCE_BUCKET:
            notes.append(
                f"reduce_bucket_size {elements:,} in its ds_config is allocated whole ({count} x "
                f'{elements * p / GiB:.2f} GiB); "auto" sizes it from the model'
            )
    elif engine in ("zero3", "zero3_offload"):
        elements, count = zero_buckets(engine, settings)
        persistent = shape.zero3_persistent_parameters(zero3_persistence(engine, settings))
        gathered = max(0, zero3_gathered_parameters(shape) - persistent) * p  # persistent ones are whole already
        static_grads = states["gradients"]
        static_buffers = elements * count * p + persistent * p
        forward[0] = gathered
        if engine == "zero3":
            # The step flattens the 16-bit gradient partition and converts it to fp32 (two copies when p = 2).
            step[2] = states["fp32_gradient_copy"] + flattened_copy
        notes.append(
            f"keeps {gathered / GiB:.2f} GiB of weights gathered through forward (stage3_max_reuse_distance 1e9)"
        )
    elif engine in ("fsdp2", HSDP):
        # Unsharded weights in the compute dtype: the root's own parameters and the final LayerNorm (not resharded
        # after forward), the current layer and the prefetched next one; in backward also one layer's unsharded
        # gradients before their reduce-scatter. Sharded gradients exist from backward to zero_grad.
        root = (psi - shape.num_hidden_layers * shape.layer_parameters) * p
        forward[0] = root + 2 * shape.layer_parameters * p
        backward_end[:] = [root + 2 * shape.layer_parameters * p, states["gradients"], shape.layer_parameters * p]
        step[1] = states["gradients"]
        if p == 2:
            # bf16 (MixedPrecisionPolicy(param_dtype=bf16), what accelerate builds for --bf16): the root casts the
            # pixels to bf16 (2 bytes a pixel); transformers' ViTModel.forward casts them back to the patch
            # projection's dtype, still the fp32 shard then (`pixel_values.to(expected_dtype)`, 4 bytes); the patch
            # embedding's own FSDP unit casts that to bf16 again (the copy the convolution keeps, in `pixels`). The
            # first two live until the forward returns.
            forward_only = shape.num_channels * shape.image_size**2 * settings.per_device_batch * (2 + 4)

    # A teacher: its weights live the whole run; its forward runs in the loss, after the student's forward and before
    # its backward, so what it holds comes on top of the end of the student's forward (its logits, b x classes x 4
    # bytes, outlive it into the backward: not counted).
    teacher_weights = teacher_forward = 0
    if settings.teacher is not None:
        teacher_weights = settings.teacher.weight_bytes(settings.precision)
        teacher_forward = settings.teacher.forward_bytes(settings.per_device_batch, settings.precision)
    if states["host"]:
        per_node = states["host"] * settings.gpus_per_node
        notes.append(f"host memory {states['host'] / GiB:.2f} GiB per rank, {per_node / GiB:.1f} GiB per node")
    parts = {
        "parameters": states["parameters"] + max(forward[0], backward_end[0], step[0]),
        "gradients": static_grads + max(forward[1], backward_end[1], step[1]),
        "optimizer_states": states["optimizer_states"],
        "activations": max(act["forward_end"] + forward_only, act["backward_start"]),
        "buffers": static_buffers + max(forward[2], backward_end[2], step[2]),
    }
    if settings.teacher is not None:
        parts["teacher"] = teacher_weights + teacher_forward
    phases = {
        "static": states["parameters"] + static_grads + states["optimizer_states"] + static_buffers + teacher_weights,
        "forward": act["forward_end"] + forward_only + sum(forward) + teacher_forward,
        "backward_start": act["backward_start"] + sum(forward),
        "backward_end": first_layer + sum(backward_end),
        "step": sum(step) + act["input_batch"],  # the Trainer holds the step's fp32 batch until the step is done
    }
    peak = phases["static"] + max(v for k, v in phases.items() if k != "static")
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
