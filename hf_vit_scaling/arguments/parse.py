"""Command-line arguments shared by the recipes: dataclasses parsed by `HfArgumentParser` with `TrainingArguments`.

`--ds_config PATH` is the project's name for the Trainer's `--deepspeed PATH`: it is resolved into
`TrainingArguments.deepspeed` before `TrainingArguments` is built, so there is one DeepSpeed code path.
"""

import json
import os
import sys
from dataclasses import dataclass, field

import yaml
from transformers import HfArgumentParser, TrainingArguments, ViTConfig

from hf_vit_scaling.arguments.regularization import RegularizationArguments, check_regularization
from hf_vit_scaling.arguments.streaming import StreamingArguments, check_streaming
from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.models.presets import DEFAULT_PRESET, MODEL_PRESETS, check_config_overrides
from hf_vit_scaling.models.weight_init import POSITION_EMBEDDING_INITS, WEIGHT_INITS, check_sincos_width
from hf_vit_scaling.parallel.deepspeed_config import check_ds_config_against_flags, load_ds_config, zero_stage
from hf_vit_scaling.parallel.distributed import ensure_single_process_env
from hf_vit_scaling.parallel.hetero import parse_shares, parse_slow_ranks
from hf_vit_scaling.parallel.sequence_parallel import check_sequence_parallel
from hf_vit_scaling.training.checkpoints import LATEST
from hf_vit_scaling.training.imbalance import CLASS_WEIGHTING
from hf_vit_scaling.training.learning_rate import LR_SCALING_RULES


def require_at_least(args, minimum: float, *flags: str) -> None:
    """Each named field, when set, is at least `minimum`; else one error naming the flag."""
    for flag in flags:
        value = getattr(args, flag)
        if value is not None and value < minimum:
            raise UserInputError(
                f"--{flag} must be >= {minimum}, got {value}. Fix: pass a value of {minimum} or more."
            )


# Below this model input size the recipe neither crops nor flips by default; 64 px is the smallest size of the ImageNet
# variants trained with random resized crops (Downsampled ImageNet 64x64, Chrabaszcz et al. 2017, uses none either).
SMALL_IMAGE_PX = 64


@dataclass
class ModelArguments:
    """Which ViT to train: a preset from scratch, or a checkpoint to fine-tune."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Hub id or local folder of a ViT checkpoint to fine-tune (e.g. "
            "google/vit-base-patch16-224-in21k). "
            "A new classification head sized to the dataset replaces the checkpoint's. Exclusive with --model_preset."
        },
    )
    model_preset: str | None = field(
        default=None,
        metadata={
            "help": "Train from scratch with a standard size: " + ", ".join(MODEL_PRESETS) + ". "
            "Default when --model_name_or_path is not given: vit-tiny-cpu.",
            "choices": list(MODEL_PRESETS),
        },
    )
    image_size: int | None = field(
        default=None, metadata={"help": "Override the preset's input resolution in pixels (presets only)."}
    )
    patch_size: int | None = field(
        default=None, metadata={"help": "Override the preset's patch size in pixels; must divide --image_size."}
    )
    config_overrides: str | None = field(
        default=None,
        metadata={
            "help": "Presets only: change fields of the preset's ViTConfig, as the HF examples' --config_overrides, "
            "e.g. hidden_size=128,num_hidden_layers=6,intermediate_size=384 (keys must exist in ViTConfig)."
        },
    )
    weight_init: str = field(
        default="hf",
        metadata={
            "help": "Presets only: how the weights start. hf: transformers' ViT init (truncated normal, std 0.02, "
            "everywhere). jax: the original ViT's, as timm's weight_init='jax' (Xavier-uniform linear layers, "
            "LeCun-normal patch projection, zero classification head). mimetic: jax, and attention "
            "weights whose products start near the identity (W_q W_k^T ~ I per head, W_v W_o ~ -I; Trockman & "
            "Kolter 2023, 'Mimetic Initialization of Self-Attention Layers'), for small data from scratch.",
            "choices": list(WEIGHT_INITS),
        },
    )
    position_embedding_init: str = field(
        default="random",
        metadata={
            "help": "Presets only: how the position embeddings start. random: transformers' (truncated normal). "
            "sincos2d: the 2-D sine-cosine table of big_vision's 'Better plain ViT baselines' (Beyer et al. 2022), "
            "still trained; the CLS position starts at zero. Needs hidden_size divisible by 4.",
            "choices": list(POSITION_EMBEDDING_INITS),
        },
    )
    attn_implementation: str = field(
        default="sdpa",
        metadata={
            "help": "Attention kernel: sdpa (default), eager, or flex_attention.",
            "choices": ["sdpa", "eager", "flex_attention"],
        },
    )
    model_revision: str = field(default="main", metadata={"help": "Branch, tag or commit of --model_name_or_path."})
    cache_dir: str | None = field(default=None, metadata={"help": "Where Hub downloads are cached."})

    def __post_init__(self):
        if self.model_name_or_path and self.model_preset:
            raise UserInputError(
                "--model_preset and --model_name_or_path are exclusive: a preset trains from scratch, a checkpoint is "
                "fine-tuned. Fix: drop one of them."
            )
        if self.model_name_or_path and self.patch_size:
            raise UserInputError(
                "--patch_size only applies to --model_preset; a checkpoint keeps its own. Fix: drop it (--image_size "
                "works with a checkpoint: its position embeddings are interpolated)."
            )
        require_at_least(self, 1, "image_size", "patch_size")
        for flag, default in (("weight_init", "hf"), ("position_embedding_init", "random")):
            if self.model_name_or_path and getattr(self, flag) != default:
                raise UserInputError(
                    f"--{flag} only applies to --model_preset: a checkpoint's weights are loaded, not initialised. "
                    f"Fix: drop --{flag}, or train a preset from scratch."
                )
        if self.config_overrides:
            if self.model_name_or_path:
                raise UserInputError(
                    "--config_overrides only applies to --model_preset (a checkpoint keeps its architecture). Fix: "
                    "drop it, or train a preset from scratch."
                )
            check_config_overrides(self.config_overrides)
        if self.position_embedding_init == "sincos2d" and self.preset:
            config = ViTConfig(**MODEL_PRESETS[self.preset])
            if self.config_overrides:
                check_config_overrides(self.config_overrides, config)
            check_sincos_width(config.hidden_size)

    @property
    def preset(self) -> str | None:
        """The preset that trains from scratch (the default one when no checkpoint is given), else None."""
        return None if self.model_name_or_path else (self.model_preset or DEFAULT_PRESET)


@dataclass
class DataArguments:
    """Where the images come from and how they are prepared."""

    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "A Hub image-classification dataset (e.g. uoft-cs/cifar10, uoft-cs/cifar100) or a "
            "folder written by "
            "datasets' save_to_disk. Default (with no --train_dir either): scikit-learn's bundled digits, no network."
        },
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "Configuration name of --dataset_name."})
    train_dir: str | None = field(
        default=None, metadata={"help": "Image folder for training: one sub-folder per class (datasets' imagefolder)."}
    )
    validation_dir: str | None = field(
        default=None, metadata={"help": "Image folder for evaluation; without it --train_val_split carves one out."}
    )
    image_column_name: str | None = field(
        default=None,
        metadata={"help": "Column holding the images. Default: detected (first Image feature, img, image)."},
    )
    label_column_name: str | None = field(
        default=None,
        metadata={"help": "Column holding integer/class labels. Default: detected (label, fine_label, ...)."},
    )
    train_val_split: float = field(
        default=0.15, metadata={"help": "Fraction of the training split held out for evaluation when none is given."}
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Use at most this many training images (after shuffling with --seed)."}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Use at most this many evaluation images (after shuffling with --seed)."}
    )
    random_resized_crop: bool | None = field(
        default=None,
        metadata={
            "help": "Training augmentation: random resized crop (scale from --crop_scale_min to 1). Default: on for "
            f"model inputs of {SMALL_IMAGE_PX} px and more, off below (a crop of 8%% of a 28 px image is 8 px wide: "
            "on Fashion-MNIST it cost 12 points, recipes/fashion_mnist/README.md)."
        },
    )
    crop_scale_min: float = field(
        default=0.08, metadata={"help": "Smallest crop area fraction for --random_resized_crop (torchvision: 0.08)."}
    )
    horizontal_flip: bool | None = field(
        default=None,
        metadata={
            "help": f"Training augmentation: random horizontal flip. Default: on for model inputs of {SMALL_IMAGE_PX} "
            "px and more, off below (small-image sets are often digits or glyphs that a mirror changes, and on "
            "Fashion-MNIST's 5,000-image subset it cost 0.9 points in 15 epochs)."
        },
    )
    random_crop_padding: int = field(
        default=0,
        metadata={
            "help": "Training augmentation: shift each image by a random whole number of pixels in [-N, N] on each "
            "axis, edges repeated: torchvision's RandomCrop(size, padding=N, padding_mode='edge'), the CIFAR "
            "recipes' augmentation (N = 4 at 32 px). Applied after the resize, in model pixels. 0: off."
        },
    )
    input_path: str = field(
        default="auto",
        metadata={
            "help": "device: uint8 batches to the device, resize/augment/normalise there, batched (fast; "
            "one image size "
            "per batch). host_crop: for variable-size images, uint8 crops at the model's size cut on the CPU (JPEGs "
            "decoded at reduced size where the crop allows), flip/normalise on the device. per_sample: resize and "
            "augment each image on the CPU in float (the reference path). auto: device for prepared shards and "
            "images of one size, else host_crop; the choice is logged.",
            "choices": ["auto", "device", "host_crop", "per_sample"],
        },
    )
    on_bad_image: str = field(
        default="skip",
        metadata={
            "help": "An image that cannot be decoded (corrupt, truncated): skip leaves it out of its batch and counts "
            "and names it (skipped_images.json, all_results.json); fail decodes every image before training and "
            "stops at the first bad one, naming it.",
            "choices": ["skip", "fail"],
        },
    )

    class_weighting: str = field(
        default="none",
        metadata={
            "help": "Imbalanced classes: balanced weights each class's cross-entropy by N / (K x N_c) from the "
            "training labels (scikit-learn's 'balanced'), so rare classes count as much as common ones. none: the "
            "plain loss. Not combined with Mixup/CutMix or label smoothing.",
            "choices": list(CLASS_WEIGHTING),
        },
    )

    def crops_at(self, image_size: int) -> bool:
        """Whether training takes random resized crops at this model input size: the flag when given, else the
        size-dependent default (torchvision/timm's crop from 8% is an ImageNet-sized default)."""
        return image_size >= SMALL_IMAGE_PX if self.random_resized_crop is None else self.random_resized_crop

    def flips_at(self, image_size: int) -> bool:
        """Whether training flips images at this model input size: the flag when given, else as `crops_at`."""
        return image_size >= SMALL_IMAGE_PX if self.horizontal_flip is None else self.horizontal_flip

    def __post_init__(self):
        if self.dataset_name and self.train_dir:
            raise UserInputError("--dataset_name and --train_dir are exclusive. Fix: pass one data source.")
        if self.validation_dir and not self.train_dir:
            raise UserInputError("--validation_dir needs --train_dir. Fix: add --train_dir or drop --validation_dir.")
        for flag in ("train_dir", "validation_dir"):
            path = getattr(self, flag)
            if path and not os.path.isdir(path):
                raise UserInputError(
                    f"--{flag} {path!r} is not a folder. Fix: point it at a folder of class sub-folders."
                )
        if not 0.0 < self.train_val_split < 1.0:
            raise UserInputError(f"--train_val_split must be between 0 and 1, got {self.train_val_split}.")
        if not 0.0 < self.crop_scale_min <= 1.0:
            raise UserInputError(f"--crop_scale_min must be in (0, 1], got {self.crop_scale_min}.")
        require_at_least(self, 1, "max_train_samples", "max_eval_samples")
        require_at_least(self, 0, "random_crop_padding")


@dataclass
class EngineArguments:
    """Which engine trains: DeepSpeed (a ds_config), FSDP2 (the Trainer's --fsdp --fsdp_config
    fsdp_configs/fsdp2.json) or the plain Trainer; and sequence parallelism on DeepSpeed."""

    ds_config: str | None = field(
        default=None,
        metadata={
            "help": "DeepSpeed JSON config (see ds_configs/). Feeds TrainingArguments.deepspeed; without "
            "it (and without --deepspeed or --fsdp) the plain Trainer runs (DDP when several processes are "
            "launched). FSDP2 instead: --fsdp --fsdp_config fsdp_configs/fsdp2.json (see fsdp_configs/README.md)."
        },
    )
    sequence_parallel_size: int = field(
        default=1,
        metadata={
            "help": "Split each training image's patch sequence over N ranks (DeepSpeed Ulysses attention); world "
            "size = data-parallel replicas x N, and the N ranks of a group share their images. Needs --ds_config "
            "(ZeRO 0-3) and a head count divisible by N. For high resolutions, e.g. ViT-B/16 at 1024 px = "
            "4,097 tokens."
        },
    )


@dataclass
class LearningRateArguments:
    """Scaling the learning rate with the global batch."""

    lr_scaling: str = field(
        default="none",
        metadata={
            "help": "Scale --learning_rate with the global batch: linear (lr x B/B_ref) or sqrt (lr x sqrt(B/B_ref)), "
            "relative to --reference_batch_size; adds a 5%% warmup when none is set. none: use it as given.",
            "choices": list(LR_SCALING_RULES),
        },
    )
    reference_batch_size: int = field(
        default=256, metadata={"help": "Global batch at which --learning_rate was tuned (for --lr_scaling)."}
    )

    def __post_init__(self):
        require_at_least(self, 1, "reference_batch_size")


@dataclass
class ClusterArguments:
    """Heterogeneous clusters: balancing per-rank batches, and simulating slow ranks for studies."""

    balance_batches: str = field(
        default="off",
        metadata={
            "help": "Heterogeneous GPUs: 'calibrate' times each rank at start and gives it a micro-batch proportional "
            "to its speed (same global batch, same gradient: losses are weighted); or explicit shares per rank, "
            "e.g. '1,2'; 'off' (default): equal micro-batches. Plain DDP and ZeRO 0-2."
        },
    )
    simulate_slow_ranks: str | None = field(
        default=None,
        metadata={
            "help": "SIMULATION for straggler studies: slow chosen ranks by a factor, e.g. '1:2.0' or '1:2.0,3:1.5'. "
            "Each step's compute on that rank is stretched by sleeping. Labelled in every report."
        },
    )

    def __post_init__(self):
        self.slow_ranks = parse_slow_ranks(self.simulate_slow_ranks)


@dataclass
class ReportArguments:
    """The throughput report."""

    throughput_warmup_steps: int = field(
        default=5, metadata={"help": "Optimizer steps excluded from the throughput report as warm-up."}
    )
    peak_tflops: float | None = field(
        default=None,
        metadata={"help": "Per-device peak TFLOP/s for MFU. Default: a table for known GPUs, a matmul probe on CPU."},
    )

    def __post_init__(self):
        require_at_least(self, 0, "throughput_warmup_steps")
        if self.peak_tflops is not None and self.peak_tflops <= 0:
            raise UserInputError("--peak_tflops must be positive (TFLOP/s per device).")


@dataclass
class ReliabilityArguments:
    """What happens on bad numbers, and what is recorded to audit a resumed run.
    (Resuming: TrainingArguments' --resume_from_checkpoint PATH, or `latest` for the newest complete checkpoint.)"""

    on_nonfinite_loss: str = field(
        default="stop",
        metadata={
            "help": "A NaN or inf training loss on any rank: stop ends training with an error naming the step and the "
            "newest complete checkpoint; skip leaves that optimizer step out on every rank and counts it "
            "(needs --gradient_accumulation_steps 1).",
            "choices": ["stop", "skip"],
        },
    )
    trace_samples: bool = field(
        default=False,
        metadata={
            "help": "Append each step's dataset rows to output_dir/sample_trace/rank{R}.jsonl, to check the "
            "data order of resumed runs."
        },
    )


@dataclass
class RecipeArguments:
    """Every argument group of a recipe run, by concern."""

    model: ModelArguments
    data: DataArguments
    engine: EngineArguments
    lr: LearningRateArguments
    cluster: ClusterArguments
    report: ReportArguments
    reliability: ReliabilityArguments
    regularization: RegularizationArguments
    streaming: StreamingArguments
    training: TrainingArguments


ALL_ARGUMENT_CLASSES = (
    ModelArguments,
    DataArguments,
    EngineArguments,
    LearningRateArguments,
    ClusterArguments,
    ReportArguments,
    ReliabilityArguments,
    RegularizationArguments,
    StreamingArguments,
    TrainingArguments,
)


def _read_args_file(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f) if path.endswith(".json") else yaml.safe_load(f)


def _resolve_ds_config(values: dict) -> None:
    """Fold `ds_config` into `deepspeed` (TrainingArguments' field), checking the file first."""
    ds_config, deepspeed = values.get("ds_config"), values.get("deepspeed")
    if ds_config and deepspeed and os.path.abspath(ds_config) != os.path.abspath(str(deepspeed)):
        raise UserInputError(
            f"--ds_config {ds_config!r} and --deepspeed {deepspeed!r} disagree. Fix: pass only one of them."
        )
    path = ds_config or deepspeed
    if path and isinstance(path, str):
        load_ds_config(path, flag="--ds_config" if ds_config else "--deepspeed")
        values["deepspeed"] = path
        ensure_single_process_env()


def check_fsdp_config_file(path) -> None:
    """TrainingArguments opens --fsdp_config with a bare open()/json.load: name the flag and the fix instead."""
    if not isinstance(path, str) or path.lstrip().startswith("{"):
        return
    if not os.path.isfile(path):
        raise UserInputError(f"--fsdp_config {path!r} does not exist. Fix: pass a file from fsdp_configs/.")
    try:
        _read_args_file(path)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserInputError(f"--fsdp_config {path!r} is not valid JSON ({err}). Fix: correct the file.") from err


def _option_value(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def has_accelerator() -> bool:
    import torch

    return torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())


def _is_args_file(arg: str) -> bool:
    return not arg.startswith("-") and arg.endswith((".json", ".yaml", ".yml"))


def _parse_args_file(parser: HfArgumentParser, path: str, overrides: list[str]) -> tuple:
    """The values of one .json/.yaml file, then any `--flag value` after it on top (as the alignment-handbook's
    `train.py config.yaml --learning_rate 1e-4`): the file's values become the parser's defaults."""
    if not os.path.isfile(path):
        raise UserInputError(f"Arguments file {path!r} does not exist. Fix: pass an existing .json/.yaml file.")
    values = _read_args_file(path) or {}
    for key in ("ds_config", "deepspeed"):
        if (given := _option_value(overrides, f"--{key}")) is not None:
            values[key] = given
    if "-h" not in overrides and "--help" not in overrides:
        _resolve_ds_config(values)
        check_fsdp_config_file(_option_value(overrides, "--fsdp_config") or values.get("fsdp_config"))
    # Without an accelerator, accelerate only sets up a multi-process (gloo) world when told it runs on CPU.
    values.setdefault("use_cpu", not has_accelerator())
    if not overrides:
        return parser.parse_dict(values)
    unknown = sorted(set(values) - {action.dest for action in parser._actions})
    if unknown:
        raise UserInputError(
            f"{path}: {', '.join(unknown)} {'is not a flag' if len(unknown) == 1 else 'are not flags'} of this "
            "recipe. Fix: remove or rename them (python recipes/train_vit.py --help lists every flag)."
        )
    parser.set_defaults(**values)  # every action of a flag (a bool's --no_<flag> too) takes the file's value
    for action in parser._actions:
        action.required = action.required and action.dest not in values
    return parser.parse_args_into_dataclasses(overrides)


def _parse(argv: list[str]) -> tuple:
    """The dataclasses from argv or from one .json/.yaml file (plus overrides after it); `--ds_config` resolved into
    `--deepspeed` first."""
    parser = HfArgumentParser(ALL_ARGUMENT_CLASSES)
    if argv and _is_args_file(argv[0]):
        return _parse_args_file(parser, argv[0], argv[1:])
    values = {"ds_config": _option_value(argv, "--ds_config"), "deepspeed": _option_value(argv, "--deepspeed")}
    if "-h" not in argv and "--help" not in argv:
        _resolve_ds_config(values)
        check_fsdp_config_file(_option_value(argv, "--fsdp_config"))
    if values.get("deepspeed") and "--deepspeed" not in argv:
        argv += ["--deepspeed", values["deepspeed"]]
    if "--use_cpu" not in argv and not has_accelerator():
        argv += ["--use_cpu", "true"]  # as above: accelerate's CPU multi-process world
    return parser.parse_args_into_dataclasses(argv)


def parse_args(argv: list[str] | None = None) -> RecipeArguments:
    """Parse every argument group from argv (or one .json/.yaml file) and check them together, before anything
    loads. Field checks live in each dataclass's `__post_init__`; checks across groups are in `validate_args`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = RecipeArguments(*_parse(argv))
    keep_hub_token_out_of_arguments(args.training)
    validate_args(args)
    check_restart_setup(args.training, os.environ)
    return args


def keep_hub_token_out_of_arguments(training_args) -> None:
    """The Trainer pickles TrainingArguments into every training_args.bin (and a pushed repo gets it). A token
    given with --hub_token moves to this process's HF_TOKEN, which huggingface_hub reads for uploads, so it is never
    saved, logged or reported."""
    if training_args.hub_token:
        os.environ["HF_TOKEN"] = training_args.hub_token
        training_args.hub_token = None


def check_restart_setup(training_args, env) -> None:
    """torchrun --max-restarts N reruns the same command after a worker dies. Refuse, before any work, the two
    setups where that restart cannot continue the run."""
    if int(env.get("TORCHELASTIC_MAX_RESTARTS", "0")) <= 0:
        return
    if training_args.resume_from_checkpoint != LATEST:
        raise UserInputError(
            "torchrun --max-restarts reruns this same command after a failure, so it must resume by itself. Fix: add "
            "--resume_from_checkpoint latest (and --save_strategy steps --save_steps N) to the recipe's flags."
        )
    if env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        raise UserInputError(
            "torchrun --max-restarts with its default (static) rendezvous shares one store across attempts: the "
            "restarted workers' process groups read the dead workers' addresses and hang (measured here; "
            "pytorch/pytorch#135712). Fix: launch with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --rdzv-backend "
            "c10d --rdzv-endpoint HOST:PORT --max-restarts N ..."
        )


def check_nonfinite_policy(reliability_args, training_args) -> None:
    if reliability_args.on_nonfinite_loss == "skip" and training_args.gradient_accumulation_steps > 1:
        raise UserInputError(
            "--on_nonfinite_loss skip needs --gradient_accumulation_steps 1 (a skipped micro-batch would leave a "
            "partial accumulated gradient). Fix: use --on_nonfinite_loss stop, or fold the accumulation into "
            "--per_device_train_batch_size."
        )


def check_balance_batches(mode: str, training_args) -> None:
    """--balance_batches: shares must name every rank, and ZeRO-3 is refused (checked before any loading)."""
    if mode == "off" or training_args.world_size == 1:
        return
    ds = getattr(training_args, "hf_deepspeed_config", None)
    if ds is not None and zero_stage(ds.config) == 3:
        raise UserInputError(
            "--balance_batches works with plain DDP and ZeRO 0-2; ZeRO-3 partitions the parameters, "
            "so the calibration cannot run the model alone on each rank. Fix: use ZeRO-2."
        )
    if mode != "calibrate":
        parse_shares(mode, training_args.world_size)


POSITIVE_TRAINING_FLAGS = (
    "per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps", "learning_rate",
)  # fmt: skip


def check_training_numbers(training_args) -> None:
    """TrainingArguments accepts these values and fails much later, after data and model loaded: refuse now."""
    for flag in POSITIVE_TRAINING_FLAGS:
        value = getattr(training_args, flag)
        if value <= 0:
            raise UserInputError(f"--{flag} must be positive, got {value}. Fix: pass a value above 0.")
    if training_args.max_steps == 0 or (training_args.max_steps < 0 and training_args.num_train_epochs <= 0):
        raise UserInputError(
            f"nothing to train: --num_train_epochs {training_args.num_train_epochs}, --max_steps "
            f"{training_args.max_steps}. Fix: pass --num_train_epochs above 0 or --max_steps above 0."
        )


def check_class_weighting(args: RecipeArguments) -> None:
    """Class weights multiply hard-label cross-entropy; soft targets (Mixup/CutMix, label smoothing) have their own
    loss, and weighting them would need a per-class weight inside the mixed target: refused rather than guessed."""
    reg = args.regularization
    soft = (reg.mixup_alpha > 0 or reg.cutmix_alpha > 0) or args.training.label_smoothing_factor > 0
    if args.data.class_weighting != "none" and soft:
        raise UserInputError(
            "--class_weighting cannot be combined with --mixup_alpha/--cutmix_alpha or --label_smoothing_factor "
            "(their soft-target loss is not class-weighted). Fix: drop one of them."
        )


def check_fsdp(args: RecipeArguments) -> None:
    """FSDP2 (`--fsdp --fsdp_config fsdp_configs/fsdp2.json`): refuse, before loading, what it cannot run here."""
    training = args.training
    plugin = training.fsdp_plugin_args
    if not plugin:
        if training.fsdp_config:  # TrainingArguments reads it only with --fsdp: the run would silently be DDP
            raise UserInputError(
                "--fsdp_config is read only with --fsdp. Fix: add --fsdp "
                "(e.g. --fsdp --fsdp_config fsdp_configs/fsdp2.json)."
            )
        return
    refusals = [
        (training.deepspeed, "--fsdp and --ds_config are two engines. Fix: pass one of them."),
        (plugin["fsdp_version"] != 2, 'the recipe runs FSDP2 only. Fix: set "version": 2 in --fsdp_config.'),
        (training.world_size < 2, "--fsdp shards over the processes of a distributed run and this is 1 process. "
         "Fix: launch 2 or more (torchrun --nproc_per_node N, accelerate launch --multi_gpu) or drop --fsdp."),
        (args.regularization.ema_decay, "--ema_decay keeps a whole float32 copy of every parameter on each rank, "
         "and FSDP2 gives each rank only its shard. Fix: drop --ema_decay, or use ds_configs/zero2.json."),
        (args.cluster.balance_batches == "calibrate", "--balance_batches calibrate runs the model alone on each "
         "rank, and FSDP2 shards its parameters. Fix: pass explicit shares (e.g. --balance_batches 1,2)."),
        (plugin.get("cpu_offload") and training.device.type == "cpu", "the fsdp_config's cpu_offload moves the "
         "shards from an accelerator to CPU memory, and this run has no accelerator (torch's CPUOffloadPolicy "
         "fails without one). Fix: use fsdp_configs/fsdp2.json."),
        (plugin.get("activation_checkpointing") and training.gradient_checkpointing, "--gradient_checkpointing "
         "and the fsdp_config's activation_checkpointing both checkpoint activations. Fix: keep one of them."),
    ]  # fmt: skip
    for refused, reason in refusals:
        if refused:
            raise UserInputError(f"--fsdp: {reason}")


def validate_args(args: RecipeArguments) -> None:
    """Checks across argument groups (each group's own checks ran in its __post_init__)."""
    training = args.training
    check_training_numbers(training)
    check_fsdp(args)
    check_nonfinite_policy(args.reliability, training)
    check_ds_config_against_flags(training)
    check_balance_batches(args.cluster.balance_batches, training)
    ds = getattr(training, "hf_deepspeed_config", None)
    check_regularization(
        args.regularization, ds.config if ds is not None else None, args.engine.sequence_parallel_size
    )
    check_class_weighting(args)
    check_streaming(args)
    preset = args.model.preset
    check_sequence_parallel(
        args.engine.sequence_parallel_size,
        training.world_size,
        ds.config if ds is not None else None,
        preset and MODEL_PRESETS[preset]["num_attention_heads"],
        args.model.attn_implementation,
        args.cluster.balance_batches,
    )
