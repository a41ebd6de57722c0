"""Checks across argument groups, run by `parse_args` before anything loads (each group's own checks are in its
`__post_init__`). `args` is the parsed `RecipeArguments`; its `run_engine` (resolved once by `parse_args`) is what
every check of the engine reads."""

import os

from hf_vit_scaling.arguments.field_checks import refuse_given_flags, require_in_range, require_writable_folder
from hf_vit_scaling.arguments.regularization import check_regularization
from hf_vit_scaling.arguments.streaming import check_streaming
from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.losses.soft_target import produces_soft_targets
from hf_vit_scaling.models.presets import MODEL_PRESETS
from hf_vit_scaling.parallel.deepspeed_config import check_ds_config_against_flags
from hf_vit_scaling.parallel.hetero import parse_shares
from hf_vit_scaling.parallel.sequence_parallel import check_sequence_parallel
from hf_vit_scaling.training.checkpoints import LATEST
from hf_vit_scaling.training.interruption import check_one_stop_handler


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


def check_balance_batches(mode: str, training_args, engine) -> None:
    """--balance_batches: shares must name every rank, and ZeRO-3 is refused (checked before any loading).
    `engine`: the run's `parallel.engine.Engine`."""
    if mode == "off" or training_args.world_size == 1:
        return
    if engine.zero_stage == 3:
        raise UserInputError(
            "--balance_batches works with plain DDP and ZeRO 0-2; ZeRO-3 partitions the parameters, "
            "so the calibration cannot run the model alone on each rank. Fix: use ZeRO-2."
        )
    if mode != "calibrate":
        parse_shares(mode, training_args.world_size)


POSITIVE_TRAINING_FLAGS = (
    "per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps", "learning_rate",
)  # fmt: skip
STEP_INTERVAL_FLAGS = ("logging_steps", "eval_steps", "save_steps")


# TrainingArguments' numbers outside these ranges are surely wrong, and it accepts them (a negative --weight_decay
# trains, a negative --max_grad_norm turns clipping off in silence) or crashes on them in its __post_init__:
# {flag: (low, high, high included, example)}, low included, high None for no upper bound.
TRAINING_RANGES = {
    "weight_decay": (0, None, False, 0.05),
    "adam_beta1": (0, 1, False, 0.9),
    "adam_beta2": (0, 1, False, 0.999),
    "adam_epsilon": (0, None, False, 1e-8),
    "max_grad_norm": (0, None, False, "1.0 (0 turns clipping off)"),
    "label_smoothing_factor": (0, 1, False, 0.1),
    "warmup_steps": (0, None, False, "0.05 (below 1: a fraction of the steps)"),
    "dataloader_num_workers": (0, None, False, "2 (0 loads in the main process)"),
}


def check_training_values(values: dict) -> None:
    """TrainingArguments' numbers, parsed but not yet built into it (its __post_init__ raises bare ValueErrors)."""
    require_in_range(values, TRAINING_RANGES)


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # torch.compile's


def check_torch_compile(training_args) -> None:
    """--torch_compile's backend and mode, which torch only checks when the first step compiles (a ValueError or
    RuntimeError traceback from every rank after the data and model loaded)."""
    if not training_args.torch_compile:
        return
    import torch._dynamo

    backends = torch._dynamo.list_backends(exclude_tags=())
    backend = training_args.torch_compile_backend
    if backend is not None and backend not in backends:
        usable = ", ".join(b for b in backends if "TESTING" not in b)
        raise UserInputError(
            f"--torch_compile_backend {backend!r} is not a torch.compile backend here. Fix: one of {usable} "
            "(inductor is the default)."
        )
    mode = training_args.torch_compile_mode
    if mode is not None and mode not in COMPILE_MODES:
        raise UserInputError(
            f"--torch_compile_mode {mode!r}: torch.compile knows {', '.join(COMPILE_MODES)}. Fix: pick one, or leave "
            "it out (default)."
        )


def check_output_dir(training_args) -> None:
    """The Trainer makes --output_dir with os.makedirs after the data and model loaded: a file there, or a place no
    folder can be made, crashed it then."""
    require_writable_folder("output_dir", training_args.output_dir)


def check_training_numbers(training_args) -> None:
    """TrainingArguments accepts these values and fails much later, after data and model loaded: refuse now."""
    for flag in POSITIVE_TRAINING_FLAGS:
        value = getattr(training_args, flag)
        if value <= 0:
            raise UserInputError(f"--{flag} must be positive, got {value}. Fix: pass a value above 0.")
    for flag in STEP_INTERVAL_FLAGS:  # TrainingArguments takes a negative interval and the run trains on
        value = getattr(training_args, flag)
        if value is not None and value <= 0:
            raise UserInputError(
                f"--{flag} must be above 0 (a number of steps, or below 1 a fraction of the run), got {value}. "
                f"Fix: e.g. --{flag} 100."
            )
    if training_args.max_steps == 0 or (training_args.max_steps < 0 and training_args.num_train_epochs <= 0):
        raise UserInputError(
            f"nothing to train: --num_train_epochs {training_args.num_train_epochs}, --max_steps "
            f"{training_args.max_steps}. Fix: pass --num_train_epochs above 0 or --max_steps above 0."
        )


def check_class_weighting(args) -> None:
    """Class weights multiply hard-label cross-entropy; soft targets (Mixup/CutMix, label smoothing) have their own
    loss, and weighting them would need a per-class weight inside the mixed target: refused rather than guessed.
    Refused only when the run does produce soft targets (`produces_soft_targets`, the predicate the augmenter and the
    loss use): --mixup_alpha 0.8 with --mixup_prob 0 mixes nothing and trains class-weighted."""
    reg = args.regularization
    soft = produces_soft_targets(
        reg.mixup_alpha, reg.cutmix_alpha, reg.mixup_prob, args.training.label_smoothing_factor
    )
    if args.data.class_weighting != "none" and soft:
        raise UserInputError(
            "--class_weighting cannot be combined with --mixup_alpha/--cutmix_alpha or --label_smoothing_factor "
            "(their soft-target loss is not class-weighted). Fix: drop one of them."
        )


def check_fsdp(args) -> None:
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
        (args.run_engine.kind == "deepspeed", "--fsdp and --ds_config are two engines. Fix: pass one of them."),
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


def check_distillation(args) -> None:
    """A teacher with flags of other groups it cannot run with (its own checks are in DistillationArguments)."""
    distil = args.distillation
    if not distil.enabled:
        return
    if distil.distillation_token and args.model.model_name_or_path:
        raise UserInputError(
            "--distillation_token builds a DeiT student from a preset; a checkpoint keeps its own architecture. Fix: "
            "drop --distillation_token (the checkpoint's class token then learns from the teacher), or train a "
            "preset with --model_preset."
        )
    if args.data.class_weighting != "none":
        raise UserInputError(
            "--class_weighting cannot be combined with --teacher_model (the distillation loss is not class-weighted). "
            "Fix: drop one of them."
        )
    if distil.distillation_token:
        reg, model = args.regularization, args.model
        vit_only = [
            ("--drop_path_rate", reg.drop_path_rate > 0),
            ("--layer_decay", reg.layer_decay is not None),
            ("--weight_init", model.weight_init != "hf"),
            ("--position_embedding_init", model.position_embedding_init != "random"),
        ]
        refuse_given_flags(
            vit_only,
            lambda flags: (
                f"{flags} work(s) on a plain ViT's blocks, and --distillation_token trains a DeiT. Fix: "
                f"drop {flags}, or --distillation_token."
            ),
        )
    if args.engine.sequence_parallel_size > 1:
        raise UserInputError(
            "--teacher_model with --sequence_parallel_size above 1: the teacher runs whole images on each rank, and "
            "sequence parallelism hands a group one rank's pixels after the teacher's copy is taken. Fix: drop "
            "--sequence_parallel_size, or the teacher."
        )


def check_cnn(args) -> None:
    """A CNN preset trains through the same recipe, without the flags that work on a ViT's tokens and blocks."""
    if not args.model.is_cnn:
        return
    reg = args.regularization
    vit_only = [
        ("--sequence_parallel_size", args.engine.sequence_parallel_size > 1),
        ("--drop_path_rate", reg.drop_path_rate > 0),
        ("--layer_decay", reg.layer_decay is not None),
        ("--distillation_token", args.distillation.distillation_token),
    ]
    refuse_given_flags(
        vit_only,
        lambda flags: (
            f"{flags} work(s) on a ViT's tokens or blocks, and --model_preset {args.model.preset} is a "
            f"CNN. Fix: drop {flags}."
        ),
    )


def validate_args(args) -> None:
    """Checks across argument groups (each group's own checks ran in its __post_init__)."""
    training = args.training
    check_output_dir(training)
    check_training_numbers(training)
    check_torch_compile(training)
    check_fsdp(args)
    check_nonfinite_policy(args.reliability, training)
    check_one_stop_handler(training.enable_jit_checkpoint)
    engine = args.run_engine
    check_ds_config_against_flags(engine.ds_config_mismatches)
    check_balance_batches(args.cluster.balance_batches, training, engine)
    check_regularization(args.regularization, engine.reading)
    check_class_weighting(args)
    check_streaming(args)
    check_distillation(args)
    check_cnn(args)
    preset = args.model.preset
    check_sequence_parallel(
        args.engine.sequence_parallel_size,
        training.world_size,
        engine.reading,
        preset and MODEL_PRESETS.get(preset, {}).get("num_attention_heads"),
        args.model.attn_implementation,
        args.cluster.balance_batches,
    )
