"""recipes/plan.py's command line: `PlanArguments` (every flag, checked at parse time) and `settings_from`, which
turns them into the planner's `PlanSettings`; `plan_inputs` says which figures of a plan are assumed."""

import os
import re
from dataclasses import dataclass, field, replace

from hf_vit_scaling.arguments.distillation import check_teacher_folder
from hf_vit_scaling.arguments.mae import MaeArguments
from hf_vit_scaling.arguments.parser import DataclassParser
from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.models.flops import HBM_GBPS, lookup_hbm_gbps, lookup_peak_tflops, match_device_key
from hf_vit_scaling.models.mae import DECODER_FIELDS
from hf_vit_scaling.models.presets import ALL_PRESETS, MODEL_PRESETS, preset_config
from hf_vit_scaling.planning.memory import PlanSettings
from hf_vit_scaling.planning.presets import PLANNER_PRESETS
from hf_vit_scaling.planning.shapes import (
    INTERCONNECTS,
    NETWORKS,
    PRECISIONS,
    GiB,
    mae_shape,
    read_ds_configs,
    vit_shape,
)
from hf_vit_scaling.planning.teacher import TeacherShape, teacher_shape


@dataclass
class PlanArguments:
    """The model, the batch and the cluster to plan for."""

    model_preset: str = field(
        default="vit-b-16",
        metadata={
            "help": "ViT size: the recipe's " + ", ".join(MODEL_PRESETS) + "; or a published large ViT's shape "
            "(planning only): " + ", ".join(PLANNER_PRESETS) + ".",
            "choices": [*MODEL_PRESETS, *PLANNER_PRESETS],
        },
    )
    image_size: int | None = field(default=None, metadata={"help": "Input resolution in pixels (preset's default)."})
    patch_size: int | None = field(default=None, metadata={"help": "Patch size in pixels (preset's default)."})
    num_labels: int = field(default=1000, metadata={"help": "Classes of the classification head."})
    per_device_train_batch_size: int = field(default=64, metadata={"help": "Images per GPU per step."})
    gpus: int = field(default=1, metadata={"help": "GPUs per node (torchrun's --nproc_per_node)."})
    nodes: int = field(default=1, metadata={"help": "Nodes."})
    gpu_memory: str | None = field(
        default=None,
        metadata={
            "help": "Memory of one GPU, e.g. 16GB, 40GB, 80GB (binary units, as GPUs are quoted: 40GB = 40 GiB). "
            "Default: the --gpu_name board's memory from the datasheet table (H200 141GB, H100 80GB, the smaller "
            "board where a name has two: A100 40GB), 40GB for a name the table lacks."
        },
    )
    gpu_name: str = field(
        default="A100",
        metadata={"help": "GPU model for the dense peak TFLOP/s table (T4, V100, A10, A100, L4, H100, H200, ...)."},
    )
    precision: str = field(
        default="bf16",
        metadata={
            "help": "bf16 or fp16 (DeepSpeed/FSDP keep 16-bit weights and fp32 master weights; plain DDP uses "
            "autocast; fp16 is planned as bf16) or fp32.",
            "choices": list(PRECISIONS),
        },
    )
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "Plan with activation checkpointing of every ViT layer (+1/3 compute)."}
    )
    selective_checkpointing: bool = field(
        default=False,
        metadata={
            "help": "Plan with selective recomputation of the attention core only (Korthikanti et al. 2022): no "
            "memory saved beside fused attention, which keeps no s x s matrix; its forward FLOPs once more."
        },
    )
    patch_dropout: float = field(
        default=0.0,
        metadata={"help": "Share of patches dropped after the patch embedding (FLIP / EVA-CLIP), in [0, 1)."},
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
        default=0.4,
        metadata={
            "help": "Assumed share of the dense peak the matrix multiplications reach when --achievable_tflops is not "
            "given; the layers' element-wise work is timed apart, at the GPU's datasheet memory bandwidth."
        },
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
        preset = preset_shape(self.model_preset)
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
        if not 0 <= self.patch_dropout < 1:
            raise UserInputError(f"--patch_dropout must be in [0, 1), got {self.patch_dropout}. Fix: e.g. 0.5.")
        if self.gradient_checkpointing and self.selective_checkpointing:
            raise UserInputError(
                "--gradient_checkpointing and --selective_checkpointing together: full checkpointing already "
                "recomputes the attention core. Fix: pass one of them."
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

    def mae_arguments(self) -> MaeArguments:
        """--mae's flags as recipes/pretrain_mae.py's own group, which checks them (the ratio, the decoder's sizes and
        heads) with the same error lines."""
        return MaeArguments(mask_ratio=self.mask_ratio, **{key: getattr(self, key) for key in DECODER_FIELDS})

    def check_mae(self) -> None:
        self.mae_arguments()
        if self.sequence_parallel_size > 1 or self.teacher_model:
            raise UserInputError(
                "--mae with --sequence_parallel_size above 1 or --teacher_model: MAE pretraining takes neither. "
                "Fix: drop them."
            )

    def decoder(self) -> dict:
        return self.mae_arguments().decoder(self.model_preset)


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
    """'40GB' → 40 × 2^30 bytes. GPU memory is quoted in binary units (an "A100 40GB" has 40 x 1,024 = 40,960 MiB),
    so GB and GiB mean the same here; a bare number is GiB."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _MEMORY_UNITS:
        raise UserInputError(f"{flag} {text!r} is not a memory size. Fix: write it like 40GB, 80GiB or 16384MB.")
    value = float(match.group(1)) * _MEMORY_UNITS[unit]
    if value <= 0:
        raise UserInputError(f"{flag} must be positive, got {text!r}. Fix: give the memory of one GPU, e.g. 40GB.")
    return int(value)


DEFAULT_GPU_MEMORY_GIB = 40  # a GPU name the datasheet table lacks


def gpu_memory_bytes(args: PlanArguments) -> int:
    """--gpu_memory, or the --gpu_name board's memory: the datasheet table's (`models.flops.HBM_GBPS`, keyed by
    board memory), the smaller board where a name has two (A100: 40 of 40 and 80 GiB)."""
    if args.gpu_memory:
        return parse_memory_size(args.gpu_memory)
    boards = HBM_GBPS.get(match_device_key(args.gpu_name) or "", {DEFAULT_GPU_MEMORY_GIB: None})
    return min(boards) * GiB


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


def hbm_gbps(args: PlanArguments) -> float | None:
    """The --gpu_name's datasheet memory bandwidth for the planner's non-GEMM term; None with a measured
    --achievable_tflops, whose measurement already spent the time that term stands for."""
    if args.achievable_tflops is not None:
        return None
    return lookup_hbm_gbps(args.gpu_name, gpu_memory_bytes(args) / GiB)


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


def preset_shape(name: str) -> dict:
    """A preset's shape: the recipe's (`models.MODEL_PRESETS`) or a published ViT's (`shapes.PLANNER_PRESETS`)."""
    return MODEL_PRESETS[name] if name in MODEL_PRESETS else PLANNER_PRESETS[name]


def settings_from(args: PlanArguments, ds_configs_dir: str) -> PlanSettings:
    preset = dict(preset_shape(args.model_preset))
    if args.mae:
        preset.pop("mlp", None)
        shape = mae_shape(preset, args.decoder(), args.mask_ratio, args.image_size, args.patch_size)
    else:
        shape = replace(
            vit_shape(preset, args.image_size, args.patch_size, args.num_labels), patch_dropout=args.patch_dropout
        )
    return PlanSettings(
        shape=shape,
        per_device_batch=args.per_device_train_batch_size,
        gpus_per_node=args.gpus,
        nodes=args.nodes,
        gpu_memory_bytes=gpu_memory_bytes(args),
        precision=args.precision,
        gradient_checkpointing=args.gradient_checkpointing,
        selective_checkpointing=args.selective_checkpointing,
        sequence_parallel_size=args.sequence_parallel_size,
        memory_margin=args.memory_margin,
        achievable_tflops=achievable_tflops(args),
        hbm_gbps=hbm_gbps(args),
        intra_node_gbps=resolve_bandwidth(args.interconnect, INTERCONNECTS, "--interconnect"),
        inter_node_gbps=resolve_bandwidth(args.network, NETWORKS, "--network"),
        host_link_gbps=resolve_bandwidth(args.host_link, INTERCONNECTS, "--host_link"),
        cpu_adam_gparams_per_s=args.cpu_adam_gparams_per_s,
        ds_configs=read_ds_configs(str(ds_configs_dir)),
        teacher=teacher_from(args, shape.image_size),
    )


def plan_inputs(args: PlanArguments) -> dict:
    """The --json report's `inputs`: the hardware named, and which figures are assumed rather than given."""
    return {
        "gpu_name": args.gpu_name,
        "mfu": None if args.achievable_tflops is not None else args.mfu,
        "hbm_gbps": hbm_gbps(args),
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


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def parse_plan_flags(argv: list[str] | None, ds_configs_dir: str) -> tuple[PlanArguments, PlanSettings]:
    """recipes/plan.py's flags -> its arguments and the planner's settings (what the recipe and the benchmarks that
    record plan.py commands both call); bad input raises UserInputError."""
    (args,) = DataclassParser(PlanArguments, script="recipes/plan.py").parse_flags(argv)
    return args, settings_from(args, ds_configs_dir)
