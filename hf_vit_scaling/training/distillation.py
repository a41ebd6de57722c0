"""DeiT distillation's teacher (`Teacher`: a frozen image classifier, whole on every rank) and the checks of a
teacher against the run's data (its classes, the rows it trained on). The loss is `losses/distillation.py`."""

import os

import torch
from transformers import AutoModelForImageClassification

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.models.weights import from_pretrained_strictly
from hf_vit_scaling.models.zero3 import zero3_init_off

TEACHER_FIX = "pass a folder saved by save_pretrained of an image classifier (config.json + model.safetensors)."


class Teacher:
    """A saved image classifier, loaded once per process: frozen (no parameter requires a gradient), in eval mode,
    run under `no_grad`, in the run's precision, moved to the student's device on its first batch. One whole copy per
    rank: it is loaded with ZeRO-3's `zero.Init` switched off, so never partitioned."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype = torch.float32):
        self.model = model.to(dtype).eval().requires_grad_(False)
        self.dtype = dtype

    @classmethod
    def from_pretrained(cls, path: str, dtype: torch.dtype = torch.float32) -> "Teacher":
        return cls(load_teacher_model(path), dtype)

    @property
    def labels(self) -> list[str]:
        """The teacher's class names in index order (config.id2label)."""
        id2label = self.model.config.id2label
        return [str(id2label[i]) for i in sorted(id2label, key=int)]

    def logits(self, pixels: torch.Tensor) -> torch.Tensor:
        """The teacher's float32 logits for the student's (augmented, normalised) pixels."""
        if next(self.model.parameters()).device != pixels.device:
            self.model.to(pixels.device)
        with torch.no_grad():
            return self.model(pixel_values=pixels.to(self.dtype)).logits.float()


def load_teacher_model(path: str) -> torch.nn.Module:
    """`AutoModelForImageClassification.from_pretrained(path)` as a whole model on every rank (under ZeRO-3 the
    Trainer's DeepSpeed config would build it partitioned); a folder that is missing or unreadable, or a checkpoint
    short of a tensor (which `from_pretrained` would fill at random), is one `error:` line naming `--teacher_model`."""
    if not os.path.isdir(path):
        raise UserInputError(f"--teacher_model {path!r} is not a folder. Fix: {TEACHER_FIX}")
    try:
        with zero3_init_off():
            return from_pretrained_strictly(
                AutoModelForImageClassification, path, UserInputError, "--teacher_model", TEACHER_FIX
            )
    except UserInputError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        reason = " ".join(str(err).split())[:300]
        raise UserInputError(f"--teacher_model {path!r} could not be read ({reason}). Fix: {TEACHER_FIX}") from None


def check_teacher_labels(teacher_labels: list[str], data_labels: list[str], path: str) -> None:
    """The teacher's classes must be the data's, in the same order (its logit i must mean the data's class i)."""
    if list(teacher_labels) != list(data_labels):
        raise UserInputError(
            f"--teacher_model {path!r} was trained on other classes than the data's: teacher {list(teacher_labels)}, "
            f"data {list(data_labels)}. Fix: pass a teacher trained on this dataset's classes, in this order."
        )


def describe_selection(selection: dict) -> str:
    """ "5000 of the 60000 training images of data/fashion_mnist, drawn by seed 42" or "all 60000 ..." """
    if selection.get("seed") is None:
        return f"all {selection['rows']} training images of {selection['source']}"
    return (
        f"{selection['rows']} of the {selection['of']} training images of {selection['source']}, drawn by seed "
        f"{selection['seed']}"
    )


def check_teacher_rows(teacher_selection: dict | None, data_selection: dict | None, path: str) -> None:
    """A teacher trained on this run's dataset must have trained on exactly this run's rows: with other rows (a
    subset drawn by another --seed, or the whole split) it has seen labelled images the student may not see, and a
    data-efficiency result would be measured on more labels than it says. Teachers trained elsewhere (another
    dataset, or a folder without the recipe's model_card.json) are not checked."""
    if not teacher_selection or not data_selection or teacher_selection["source"] != data_selection["source"]:
        return
    if teacher_selection != data_selection:
        raise UserInputError(
            f"--teacher_model {path!r} was trained on {describe_selection(teacher_selection)}; this run trains on "
            f"{describe_selection(data_selection)}, so the teacher has seen labelled images this student may not "
            "see (--max_train_samples and a drawn validation split depend on --seed). Fix: train the teacher with "
            "this run's --max_train_samples and --seed, or run the student with the teacher's."
        )
