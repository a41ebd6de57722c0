"""recipes/plan.py's printed plan: memory per engine, the largest batch, step time and the recommendation."""

from hf_vit_scaling.models.flops import train_flops_per_image
from hf_vit_scaling.planning.memory import PlanSettings
from hf_vit_scaling.planning.plan import Plan
from hf_vit_scaling.planning.plan_arguments import PlanArguments, plan_inputs
from hf_vit_scaling.planning.shapes import ENGINE_FLAGS, ENGINE_NAMES, GiB, MaeShape


def _gib(value: int) -> str:
    return f"{value / GiB:.2f}"


PART_HEADERS = {
    "parameters": "params",
    "gradients": "grads",
    "optimizer_states": "optim",
    "activations": "activ",
    "buffers": "buffers",
    "teacher": "teacher",
}


def teacher_lines(s: PlanSettings) -> list[str]:
    """The teacher's line of the plan's header (none without a teacher)."""
    t = s.teacher
    if t is None:
        return []
    weights, forward = t.weight_bytes(s.precision), t.forward_bytes(s.per_device_batch, s.precision)
    return [
        f"Teacher: {t.name}, {t.weight_elements / 1e6:.2f} M weights held whole on every GPU ({weights / 2**20:.1f} "
        f"MiB in {s.precision}, never partitioned) + {forward / 2**20:.1f} MiB for its no_grad forward on "
        f"{s.per_device_batch} images; {t.forward_flops_per_image / 1e9:.3g} GFLOP forward per image"
    ]


def checkpointing(s: PlanSettings) -> str:
    if s.gradient_checkpointing:
        return "gradient checkpointing on"
    return "selective checkpointing (attention core)" if s.selective_checkpointing else "gradient checkpointing off"


def hbm_text(s: PlanSettings) -> str:
    if s.hbm_gbps is None:
        return "no separate memory-bound term (in the measured TFLOP/s)"
    return f"{s.hbm_gbps:g} GB/s HBM for the non-GEMM work"


def communication_lines(option) -> list[str]:
    """The recommended engine's collectives per step: bytes per rank, link class, bandwidth, seconds."""
    terms = option.speed.terms
    if not terms:
        return []
    lines = [f"Communication per step ({option.name}, per rank; ring volumes, no overlap):"]
    for t in terms:
        lines.append(
            f"  {t.collective} of {t.what}: {t.bytes_per_rank / 1e9:.3f} GB over {t.link} at "
            f"{t.gbps:g} GB/s = {t.seconds:.4f} s"
        )
    return lines


def plan_json(args: PlanArguments, result: Plan) -> dict:
    """recipes/plan.py --json: the plan and its inputs (which figures are assumed)."""
    report = result.to_dict()
    report["inputs"] = plan_inputs(args)
    return report


def format_plan(result: Plan) -> str:
    """A table per engine (GiB per rank; step time in seconds), the inputs, and the recommendation."""
    s = result.settings
    shape = s.shape
    if isinstance(shape, MaeShape):
        model = (
            f"MAE: {shape.num_parameters / 1e6:.1f} M parameters, encoder on {shape.visible_tokens} of "
            f"{shape.tokens} tokens (mask ratio {shape.mask_ratio:g}), decoder {shape.decoder_hidden_size} "
            f"wide x {shape.decoder_num_hidden_layers} on {shape.tokens}"
        )
    else:
        model = f"ViT: {shape.num_parameters / 1e6:.1f} M parameters, {shape.tokens} tokens"
    lines = [
        f"{model}, {train_flops_per_image(shape) / 1e9:.1f} GFLOP per training image; {s.per_device_batch} images per "
        f"device, {s.precision}, {checkpointing(s)}, sequence parallel {s.sequence_parallel_size}",
        f"Cluster: {s.nodes} node(s) x {s.gpus_per_node} GPUs of {s.gpu_memory_bytes / GiB:.1f} GiB, "
        f"margin {s.memory_margin:.0%}; assumed: {s.achievable_tflops:g} TFLOP/s achievable per GPU, "
        f"{hbm_text(s)}, "
        f"{s.intra_node_gbps:g} GB/s in a node, {s.inter_node_gbps:g} GB/s between nodes, "
        f"{s.host_link_gbps:g} GB/s host link, CPU Adam {s.cpu_adam_gparams_per_s:g} G params/s",
        *teacher_lines(s),
        "",
    ]
    header = [
        "engine",
        *(PART_HEADERS[part] for part in result.options[0].memory.parts),
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
        communication = speed.communication_s
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
        "Memory in GiB per rank. peak = static + max(end of forward, start of backward, end of backward, optimizer "
        "step): gradients and activations are not live together, so the columns do not add up to it.",
        "Step time is an estimate: compute (GEMMs at the TFLOP/s above + LayerNorms, activations, residual adds and "
        "bias gradients at the HBM bandwidth) + communication, no overlap (comm s: collectives, host transfers and "
        "CPU Adam) + DeepSpeed's host-side work per step (bucket flushes, ZeRO-3 gathers; per-operation costs fitted "
        "to one H200 run); the bandwidths and TFLOP/s above are inputs.",
    ]
    notes = [f"  {o.name}: {note}" for o in result.options for note in o.memory.notes]
    if notes:
        lines += ["Notes:", *notes]
    if result.recommended:
        flags = ENGINE_FLAGS[result.recommended]
        lines += ["", f"Recommended: {ENGINE_NAMES[result.recommended]}  {flags}", f"Why: {result.reason}"]
        lines += communication_lines(next(o for o in result.options if o.engine == result.recommended))
    else:
        lines += ["", f"Recommended: none. {result.reason}"]
    return "\n".join(lines)
