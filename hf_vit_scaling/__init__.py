"""hf-vit-scaling: the small shared package the recipes import."""

from .arguments import (
    DataArguments,
    ModelArguments,
    ReliabilityArguments,
    ScalingArguments,
    ensure_single_process_env,
    parse_args,
    parse_slow_ranks,
)
from .checkpoints import (
    checkpoint_problem,
    mark_checkpoint_complete,
    needs_universal_checkpoint,
    newest_complete_checkpoint,
    prepare_world_size_change,
    resolve_resume_checkpoint,
    write_json_atomically,
)
from .data import (
    BUILTIN_DATASET,
    ImageClassificationData,
    ImageTransform,
    attach_transforms,
    collate_image_batch,
    find_bad_images,
    load_image_classification_data,
    with_sample_index,
)
from .deepspeed_config import init_deepspeed_comm, load_ds_config, offload_targets, shutdown_distributed, zero_stage
from .errors import UserInputError
from .fast_input import DevicePreprocessor, attach_uint8_transforms, choose_input_path, collate_uint8_batch
from .flops import (
    lookup_peak_tflops,
    measure_matmul_peak_tflops,
    mfu,
    vit_forward_macs_per_image,
    vit_train_flops_per_image,
)
from .hetero import SlowRankSimulator, UnevenBatchSampler, calibrate_speeds, loss_weight, parse_shares, split_batch
from .lr_scaling import LR_SCALING_RULES, apply_lr_scaling, scaled_learning_rate
from .metrics import make_compute_metrics, topk_accuracy
from .model_card import render_model_card, write_model_card
from .models import (
    DEFAULT_PRESET,
    MODEL_PRESETS,
    build_model_from_preset,
    count_parameters,
    image_processor_for,
    load_model_for_finetuning,
    preset_config,
)
from .sequence_parallel import ViTSequenceParallel, check_sequence_parallel, setup_sequence_parallel
from .throughput import ThroughputCallback, add_throughput_callback, format_report, load_throughput_report
from .trainer import CheckpointSaveError, NonFiniteLossError, TrainingStopped, VitTrainer

__version__ = "0.1.0"

__all__ = [
    "ReliabilityArguments",
    "find_bad_images",
    "with_sample_index",
    "checkpoint_problem",
    "mark_checkpoint_complete",
    "needs_universal_checkpoint",
    "newest_complete_checkpoint",
    "prepare_world_size_change",
    "resolve_resume_checkpoint",
    "write_json_atomically",
    "CheckpointSaveError",
    "NonFiniteLossError",
    "TrainingStopped",
    "SlowRankSimulator",
    "ViTSequenceParallel",
    "check_sequence_parallel",
    "setup_sequence_parallel",
    "UnevenBatchSampler",
    "calibrate_speeds",
    "loss_weight",
    "parse_shares",
    "split_batch",
    "LR_SCALING_RULES",
    "apply_lr_scaling",
    "scaled_learning_rate",
    "BUILTIN_DATASET",
    "DEFAULT_PRESET",
    "DataArguments",
    "DevicePreprocessor",
    "ImageClassificationData",
    "ImageTransform",
    "MODEL_PRESETS",
    "ModelArguments",
    "ScalingArguments",
    "ThroughputCallback",
    "UserInputError",
    "VitTrainer",
    "add_throughput_callback",
    "attach_transforms",
    "attach_uint8_transforms",
    "build_model_from_preset",
    "choose_input_path",
    "collate_image_batch",
    "collate_uint8_batch",
    "count_parameters",
    "ensure_single_process_env",
    "format_report",
    "image_processor_for",
    "init_deepspeed_comm",
    "shutdown_distributed",
    "load_ds_config",
    "load_image_classification_data",
    "load_model_for_finetuning",
    "load_throughput_report",
    "lookup_peak_tflops",
    "make_compute_metrics",
    "measure_matmul_peak_tflops",
    "mfu",
    "offload_targets",
    "parse_args",
    "parse_slow_ranks",
    "preset_config",
    "render_model_card",
    "topk_accuracy",
    "vit_forward_macs_per_image",
    "vit_train_flops_per_image",
    "write_model_card",
    "zero_stage",
]
