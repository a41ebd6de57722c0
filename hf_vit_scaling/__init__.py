"""hf-vit-scaling: the small package the recipes import. Everything else lives in its module (see the README's
project structure)."""

from .arguments import DataArguments, parse_args
from .data import load_image_classification_data
from .distributed import shutdown_distributed
from .errors import TrainingStopped, UserInputError
from .log import exit_code_for
from .run import build_model, finish_run, prepare_inputs, prepare_world
from .throughput import add_throughput_callback, load_throughput_report
from .trainer import VitTrainer

__version__ = "0.1.0"

__all__ = [
    "DataArguments",
    "TrainingStopped",
    "UserInputError",
    "VitTrainer",
    "add_throughput_callback",
    "build_model",
    "exit_code_for",
    "finish_run",
    "load_image_classification_data",
    "load_throughput_report",
    "parse_args",
    "prepare_inputs",
    "prepare_world",
    "shutdown_distributed",
]
