#!/usr/bin/env python
"""Plan a ViT training run before launching it: memory per GPU, the largest batch and a step-time estimate for DDP,
ZeRO-1/2/3 (and their offload variants) and FSDP2, with a recommendation. Nothing is launched; no GPU needed.

    python recipes/plan.py --model_preset vit-l-16 --image_size 224 --per_device_train_batch_size 64 \
        --gpus 8 --gpu_memory 40GB --nodes 4 --interconnect nvlink3 --network ib-hdr --precision bf16

With a distillation teacher (`--teacher_model`: a folder saved by the recipe, or a preset name such as
resnet-tiny-cpu) every rank also holds the whole teacher in --precision and its forward's tensors for one micro-batch,
and computes its forward.

MAE pretraining (recipes/pretrain_mae.py, `--mae`): the encoder runs on the visible tokens only, a decoder on all:

    python recipes/plan.py --mae --model_preset vit-l-16 --mask_ratio 0.75 --per_device_train_batch_size 256 --gpus 8

`--json` prints the same plan as JSON. Bandwidths and the achievable TFLOP/s are assumptions unless you pass your
own measured numbers (nccl-tests' bus bandwidth, a throughput.json from recipes/train_vit.py); docs/planner.md
explains every formula and shows how the estimates compare with measurements.
"""

import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from transformers import HfArgumentParser

from hf_vit_scaling.arguments.distillation import check_teacher_folder
from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.models.flops import lookup_peak_tflops, train_flops_per_image
from hf_vit_scaling.models.mae import DECODER_FIELDS, DECODER_PRESETS
from hf_vit_scaling.models.presets import ALL_PRESETS, MODEL_PRESETS, preset_config
from hf_vit_scaling.planning.memory import PlanSettings
from hf_vit_scaling.planning.plan import Plan, plan
from hf_vit_scaling.planning.shapes import (
    ENGINE_FLAGS,
    ENGINE_NAMES,
    INTERCONNECTS,
    NETWORKS,
    PRECISIONS,
    GiB,
    MaeShape,
    mae_shape,
    read_ds_configs,
    vit_shape,
)
from hf_vit_scaling.planning.teacher import TeacherShape, teacher_shape

DS_CONFIGS = Path(__file__).resolve().parents[1] / "ds_configs"


@dataclass
class PlanArguments:
    """The model, the batch and the cluster to plan for."""

    model_preset: str = field(
        default="vit-b-16",
        metadata={"help": "ViT size: " + ", ".join(MODEL_PRESETS) + ".", "choices": list(MODEL_PRESETS)},
    )
    image_size: int | None = field(default=None, metadata={"help": "Input resolution in pixels (preset's default)."})
    patch_size: int | None = field(default=None, metadata={"help": "Patch size in pixels (preset's default)."})
    num_labels: int = field(default=1000, metadata={"help": "Classes of the classification head."})
    per_device_train_batch_size: int = field(default=64, metadata={"help": "Images per GPU per step."})
    gpus: int = field(default=1, metadata={"help": "GPUs per node (torchrun's --nproc_per_node)."})
    nodes: int = field(default=1, metadata={"help": "Nodes."})
    gpu_memory: str = field(
        default="40GB",
        metadata={
            "help": "Memory of one GPU, e.g. 16GB, 40GB, 80GB (binary units, as GPUs are quoted: 40GB = 40 GiB)."
        },
    )
    gpu_name: str = field(
        default="A100",
        metadata={"help": "GPU model for the dense peak TFLOP/s table (T4, V100, A10, A100, L4, H100, H200, ...)."},
    )
    precision: str = field(
        default="bf16",
        metadata={
            "help": "bf16 (DeepSpeed/FSDP keep bf16 weights; plain DDP uses autocast) or fp32.",
            "choices": list(PRECISIONS),
        },
    )
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "Plan with activation checkpointing of every ViT layer (+1/3 compute)."}
    )
    sequence_parallel_size: int = field(
        default=1,
        metadata={
            "help": "Split each image's tokens over N GPUs (DeepSpeed Ulysses, ZeRO engines only); N must "
            "divide the head count and the number of GPUs."
        },
    )
    interconnect: str = field(
        default="pcie4",
        metadata={
            "help": "Link between GPUs of a node: " + ", ".join(INTERCONNECTS) + ", or its bus bandwidth in "
            "GB/s (nccl-tests' busbw). Named links are assumptions (roughly 65-90%% of the line rate)."
        },
    )
    network: str = field(
        default="eth100",
        metadata={
            "help": "Network between nodes: " + ", ".join(NETWORKS) + ", or the node's bus bandwidth in "
            "GB/s. Only used with --nodes > 1."
        },
    )
    host_link: str = field(
        default="pcie4",
        metadata={"help": "GPU-host link for the offload variants: " + ", ".join(INTERCONNECTS) + " or GB/s."},
    )
    achievable_tflops: float | None = field(
        default=None, metadata={"help": "Achieved TFLOP/s per GPU (from a throughput.json); default: peak x --mfu."}
    )
    mfu: float = field(
        default=0.4, metadata={"help": "Assumed model-FLOPs utilisation when --achievable_tflops is not given."}
    )
    cpu_adam_gparams_per_s: float = field(
        default=1.0, metadata={"help": "Assumed CPU Adam speed per rank for the offload variants (G params/s)."}
    )
    memory_margin: float = field(
        default=0.10,
        metadata={"help": "Fraction of GPU memory kept free for the CUDA context, NCCL buffers and fragmentation."},
    )
    teacher_model: str | None = field(
        default=None,
        metadata={
            "help": "A distillation teacher, as recipes/train_vit.py --teacher_model: a saved classifier's folder "
            "(only its config.json is read) or a preset name (" + ", ".join(ALL_PRESETS) + ", with "
            "--num_labels classes). Adds one whole copy per GPU in --precision, its forward's tensors for one "
            "micro-batch and its forward FLOPs, at the student's image size."
        },
    )
    mae: bool = field(
        default=False,
        metadata={
            "help": "Plan MAE pretraining (recipes/pretrain_mae.py): the preset's encoder on the visible tokens, the "
            "decoder (the preset's, or the --decoder_* sizes) on every token; no classifier."
        },
    )
    mask_ratio: float = field(default=0.75, metadata={"help": "With --mae: fraction of patches masked, in (0, 1)."})
    decoder_hidden_size: int | None = field(default=None, metadata={"help": "With --mae: decoder width."})
    decoder_num_hidden_layers: int | None = field(default=None, metadata={"help": "With --mae: decoder depth."})
    decoder_num_attention_heads: int | None = field(default=None, metadata={"help": "With --mae: decoder heads."})
    decoder_intermediate_size: int | None = field(default=None, metadata={"help": "With --mae: decoder MLP width."})
    json: bool = field(default=False, metadata={"help": "Print the plan as JSON instead of a table."})

    def __post_init__(self):
        positive = {
            "--per_device_train_batch_size": self.per_device_train_batch_size,
            "--gpus": self.gpus,
            "--nodes": self.nodes,
            "--num_labels": self.num_labels,
            "--sequence_parallel_size": self.sequence_parallel_size,
        }
        for flag, value in positive.items():
            if value <= 0:
                raise UserInputError(f"{flag} must be positive, got {value}. Fix: pass a whole number >= 1.")
        preset = MODEL_PRESETS[self.model_preset]
        image, patch = self.image_size or preset["image_size"], self.patch_size or preset["patch_size"]
        if image <= 0 or patch <= 0 or image % patch:
            raise UserInputError(
                f"--image_size {image} and --patch_size {patch}: the image must be a positive "
                "multiple of the patch. Fix: e.g. --image_size 224 --patch_size 16."
            )
        sp, world, heads = self.sequence_parallel_size, self.gpus * self.nodes, preset["num_attention_heads"]
        if world % sp or heads % sp:
            raise UserInputError(
                f"--sequence_parallel_size {sp} must divide the {world} GPUs and the "
                f"{heads} attention heads of {self.model_preset}. Fix: pick a common divisor."
            )
        if not 0 <= self.memory_margin < 1:
            raise UserInputError(f"--memory_margin must be in [0, 1), got {self.memory_margin}. Fix: e.g. 0.1.")
        if self.achievable_tflops is not None and not self.achievable_tflops > 0:
            raise UserInputError(f"--achievable_tflops must be positive, got {self.achievable_tflops}.")
        if not 0 < self.mfu <= 1:
            raise UserInputError(f"--mfu must be in (0, 1], got {self.mfu}. Fix: e.g. 0.4.")
        if not self.cpu_adam_gparams_per_s > 0:
            raise UserInputError(f"--cpu_adam_gparams_per_s must be positive, got {self.cpu_adam_gparams_per_s}.")
        if self.mae:
            self.check_mae()
        if self.teacher_model and sp > 1:
            raise UserInputError(
                "--teacher_model with --sequence_parallel_size above 1: the recipe refuses sequence parallelism "
                "beside a teacher. Fix: drop one of the two."
            )

    def check_mae(self) -> None:
        """--mae's values, as recipes/pretrain_mae.py checks them (one error line each)."""
        if not 0 < self.mask_ratio < 1:
            raise UserInputError(f"--mask_ratio must be in (0, 1), got {self.mask_ratio}. Fix: e.g. 0.75.")
        for key in DECODER_FIELDS:
            value = getattr(self, key)
            if value is not None and value <= 0:
                raise UserInputError(f"--{key} must be positive, got {value}. Fix: pass a whole number >= 1.")
        if self.sequence_parallel_size > 1 or self.teacher_model:
            raise UserInputError(
                "--mae with --sequence_parallel_size above 1 or --teacher_model: MAE pretraining takes neither. "
                "Fix: drop them."
            )

    def decoder(self) -> dict:
        sizes = dict(DECODER_PRESETS[self.model_preset])
        sizes.update({key: getattr(self, key) for key in DECODER_FIELDS if getattr(self, key) is not None})
        return sizes


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


def achievable_tflops(args: PlanArguments) -> float:
    if args.achievable_tflops is not None:
        return args.achievable_tflops
    peak = lookup_peak_tflops(args.gpu_name, args.precision)
    if peak is None:
        raise UserInputError(
            f"No {args.precision} peak TFLOP/s known for --gpu_name {args.gpu_name!r}. Fix: pass "
            "--achievable_tflops (measured TFLOP/s per GPU), or a --gpu_name from the table."
        )
    return peak * args.mfu


def teacher_from(args: PlanArguments, image_size: int) -> TeacherShape | None:
    """The teacher of `--teacher_model` at the student's image size: a preset with --num_labels classes, or a
    saved folder's config.json (its weights are not read)."""
    name = args.teacher_model
    if not name:
        return None
    if name in ALL_PRESETS:
        config = preset_config(name, [str(i) for i in range(args.num_labels)])
    elif os.path.isfile(os.path.join(name, "config.json")):
        config = check_teacher_folder(name)  # the recipe's own check: a readable classifier config, or one error
    else:
        raise UserInputError(
            f"--teacher_model {name!r} is neither a folder with a config.json nor a preset. Fix: pass a saved "
            f"classifier's folder, or one of {', '.join(ALL_PRESETS)}."
        )
    return teacher_shape(config, image_size, name)


def settings_from(args: PlanArguments) -> PlanSettings:
    preset = MODEL_PRESETS[args.model_preset]
    if args.mae:
        shape = mae_shape(preset, args.decoder(), args.mask_ratio, args.image_size, args.patch_size)
    else:
        shape = vit_shape(preset, args.image_size, args.patch_size, args.num_labels)
    return PlanSettings(
        shape=shape,
        per_device_batch=args.per_device_train_batch_size,
        gpus_per_node=args.gpus,
        nodes=args.nodes,
        gpu_memory_bytes=parse_memory_size(args.gpu_memory),
        precision=args.precision,
        gradient_checkpointing=args.gradient_checkpointing,
        sequence_parallel_size=args.sequence_parallel_size,
        memory_margin=args.memory_margin,
        achievable_tflops=achievable_tflops(args),
        intra_node_gbps=resolve_bandwidth(args.interconnect, INTERCONNECTS, "--interconnect"),
        inter_node_gbps=resolve_bandwidth(args.network, NETWORKS, "--network"),
        host_link_gbps=resolve_bandwidth(args.host_link, INTERCONNECTS, "--host_link"),
        cpu_adam_gparams_per_s=args.cpu_adam_gparams_per_s,
        ds_configs=read_ds_configs(str(DS_CONFIGS)),
        teacher=teacher_from(args, shape.image_size),
    )


def _gib(value: int) -> str:
    return f"{value / GiB:.2f}"


PART_HEADERS = {"parameters": "params", "gradients": "grads", "optimizer_states": "optim", "activations": "activ",
                "buffers": "buffers", "teacher": "teacher"}  # fmt: skip


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


def format_plan(result: Plan) -> str:
    """A table per engine (GiB per rank; step time in seconds), the inputs, and the recommendation."""
    s = result.settings
    shape = s.shape
    if isinstance(shape, MaeShape):
        model = (f"MAE: {shape.num_parameters / 1e6:.1f} M parameters, encoder on {shape.visible_tokens} of "
                 f"{shape.tokens} tokens (mask ratio {shape.mask_ratio:g}), decoder {shape.decoder_hidden_size} "
                 f"wide x {shape.decoder_num_hidden_layers} on {shape.tokens}")  # fmt: skip
    else:
        model = f"ViT: {shape.num_parameters / 1e6:.1f} M parameters, {shape.tokens} tokens"
    lines = [
        f"{model}, {train_flops_per_image(shape) / 1e9:.1f} GFLOP per training image; {s.per_device_batch} images per "
        f"device, {s.precision}, gradient checkpointing {'on' if s.gradient_checkpointing else 'off'}, "
        f"sequence parallel {s.sequence_parallel_size}",
        f"Cluster: {s.nodes} node(s) x {s.gpus_per_node} GPUs of {s.gpu_memory_bytes / GiB:.1f} GiB, "
        f"margin {s.memory_margin:.0%}; assumed: {s.achievable_tflops:g} TFLOP/s achievable per GPU, "
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
        "Memory in GiB per rank. peak = static + max(end of forward, start of backward, end of backward, optimizer "
        "step): gradients and activations are not live together, so the columns do not add up to it.",
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


def main(argv: list[str] | None = None) -> int:
    # Parse and check everything before any work: one `error: ... Fix: ...` line and exit status 2 on bad input.
    try:
        (args,) = HfArgumentParser(PlanArguments).parse_args_into_dataclasses(argv)
        settings = settings_from(args)
    except UserInputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    result = plan(settings)
    if args.json:
        report = result.to_dict()
        report["inputs"] = {
            "gpu_name": args.gpu_name,
            "mfu": None if args.achievable_tflops is not None else args.mfu,
            "interconnect": args.interconnect,
            "network": args.network,
            "host_link": args.host_link,
            "assumed": [
                name
                for name, given in (
                    ("achievable_tflops", args.achievable_tflops is not None),
                    ("interconnect", _is_number(args.interconnect)),
                    ("network", _is_number(args.network)),
                    ("host_link", _is_number(args.host_link)),
                    ("cpu_adam_gparams_per_s", False),
                )
                if not given
            ],
        }
        print(json.dumps(report, indent=2))
    else:
        print(format_plan(result))
    return 0


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
