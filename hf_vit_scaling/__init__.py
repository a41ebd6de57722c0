"""hf-vit-scaling: the small package the recipes import. Everything else lives in its module (see the README's
project structure)."""

from hf_vit_scaling.arguments.data import DataArguments
from hf_vit_scaling.arguments.model import ModelArguments
from hf_vit_scaling.arguments.parse import parse_args
from hf_vit_scaling.data import attach_transforms, collate_image_batch, load_image_classification_data
from hf_vit_scaling.errors import TrainingStopped, UserInputError
from hf_vit_scaling.evaluation.metrics import make_compute_metrics
from hf_vit_scaling.log import exit_code_for
from hf_vit_scaling.parallel.distributed import shutdown_distributed
from hf_vit_scaling.pretraining.run import build_mae_model, finish_mae_run, prepare_mae_inputs, prepare_mae_training
from hf_vit_scaling.pretraining.trainer import MaeTrainer
from hf_vit_scaling.throughput import add_throughput_callback, load_throughput_report
from hf_vit_scaling.training.run import build_model, finish_run, prepare_inputs, prepare_world
from hf_vit_scaling.training.trainer import VitTrainer

__version__ = "0.1.0"

__all__ = [
    "DataArguments",
    "MaeTrainer",
    "ModelArguments",
    "TrainingStopped",
    "UserInputError",
    "VitTrainer",
    "add_throughput_callback",
    "attach_transforms",
    "build_mae_model",
    "build_model",
    "collate_image_batch",
    "exit_code_for",
    "finish_mae_run",
    "finish_run",
    "load_image_classification_data",
    "load_throughput_report",
    "make_compute_metrics",
    "parse_args",
    "prepare_inputs",
    "prepare_mae_inputs",
    "prepare_mae_training",
    "prepare_world",
    "shutdown_distributed",
]
