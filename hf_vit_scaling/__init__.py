"""hf-vit-scaling: the small package the recipes import. Everything else lives in its module (docs/layout.md).

The names below are imported on first use (PEP 562, as transformers' own top level does): `from hf_vit_scaling
import build_model` loads `models/build.py` and what it needs, not MAE pretraining, streaming or the throughput
report. Each name's home is in `_EXPORTS`."""

from hf_vit_scaling.utils import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "DataArguments": ".arguments.data",
    "DataclassParser": ".arguments.parser",
    "ModelArguments": ".arguments.model",
    "parse_args": ".arguments.parse",
    "attach_transforms": ".data.host_transforms",
    "collate_image_batch": ".data.decoding",
    "load_image_classification_data": ".data.loading",
    "TrainingInterrupted": ".errors",
    "TrainingStopped": ".errors",
    "UserInputError": ".errors",
    "exit_code_for": ".errors",
    "make_compute_metrics": ".evaluation.metrics",
    "build_model": ".models.build",
    "shutdown_distributed": ".parallel.distributed",
    "build_mae_model": ".pretraining.run",
    "finish_mae_run": ".pretraining.run",
    "prepare_mae_inputs": ".pretraining.run",
    "prepare_mae_training": ".pretraining.run",
    "MaeTrainer": ".pretraining.trainer",
    "add_throughput_callback": ".throughput.timing",
    "load_throughput_report": ".throughput.schema",
    "finish_run": ".training.run",
    "prepare_inputs": ".training.run",
    "prepare_world": ".training.run",
    "exit_code_of": ".training.recipe",
    "trainer_arguments": ".training.recipe",
    "VitTrainer": ".training.trainer",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)


def __dir__() -> list[str]:
    return [*globals(), *__all__]
