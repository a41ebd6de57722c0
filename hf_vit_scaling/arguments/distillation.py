"""The distillation group: a teacher (`training.distillation`), and DeiT's loss (`losses.distillation`).

Every distillation flag needs `--teacher_model`; the teacher's folder is read (its config) here, before any data
loads; its weights load after the model is built, and its classes and training rows are checked against the data's
after the data loads (`training.distillation.check_teacher_labels`, `check_teacher_rows`), before training starts.
"""

from dataclasses import dataclass, field

from transformers import AutoConfig, PretrainedConfig

from hf_vit_scaling.arguments.field_checks import require_folder
from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.losses.distillation import DEFAULT_ALPHA, DEFAULT_TAU, DISTILLATION_TYPES
from hf_vit_scaling.training.distillation import TEACHER_FIX


@dataclass
class DistillationArguments:
    """DeiT distillation (Touvron et al. 2021) from a saved image classifier, e.g. a CNN trained by this recipe."""

    teacher_model: str | None = field(
        default=None,
        metadata={
            "help": "Folder of a saved AutoModelForImageClassification (e.g. a ResNet trained by this recipe) whose "
            "logits on the student's augmented batch join the loss. Frozen, one whole copy per process. Its "
            "classes (config.id2label) must be the data's, in the same order."
        },
    )
    distillation_type: str | None = field(
        default=None,
        metadata={
            "help": "soft: (1 - alpha) CE(labels) + alpha tau^2 KL(teacher || student), both softened by tau; hard: "
            "(1 - alpha) CE(labels) + alpha CE(teacher's argmax). Default with --teacher_model: soft.",
            "choices": list(DISTILLATION_TYPES),
        },
    )
    distillation_alpha: float | None = field(
        default=None,
        metadata={
            "help": "Weight of the teacher's term, in [0, 1]. Default: DeiT's, "
            f"{DEFAULT_ALPHA['soft']} for soft, {DEFAULT_ALPHA['hard']} for hard."
        },
    )
    distillation_tau: float | None = field(
        default=None,
        metadata={"help": f"Soft distillation's temperature, above 0. Default: DeiT's {DEFAULT_TAU:g}."},
    )
    distillation_token: bool = field(
        default=False,
        metadata={
            "help": "Presets only: train transformers' DeiTForImageClassificationWithTeacher (a distillation token "
            "and head beside the class token's; the teacher term trains that head) instead of a plain ViT. Saved "
            "logits average the two heads, as DeiT infers."
        },
    )

    def __post_init__(self):
        values = {
            "distillation_type": None if self.distillation_type == "none" else self.distillation_type,
            "distillation_alpha": self.distillation_alpha,
            "distillation_tau": self.distillation_tau,
            "distillation_token": self.distillation_token or None,
        }
        given = [f"--{name}" for name, value in values.items() if value is not None]
        if not self.teacher_model:
            if given:
                raise UserInputError(
                    f"{', '.join(given)} without --teacher_model: there is no teacher to distil from. Fix: add "
                    "--teacher_model FOLDER (a saved image classifier), or drop the distillation flags."
                )
            self.distillation_type = "none"
            return
        if self.distillation_type == "none":
            raise UserInputError(
                "--teacher_model with --distillation_type none: the teacher would be loaded and never used. Fix: "
                "drop --teacher_model, or pass --distillation_type soft or hard."
            )
        check_teacher_folder(self.teacher_model)
        self.distillation_type = self.distillation_type or "soft"
        if self.distillation_alpha is None:
            self.distillation_alpha = DEFAULT_ALPHA[self.distillation_type]
        if self.distillation_tau is None:
            self.distillation_tau = DEFAULT_TAU
        if not 0 <= self.distillation_alpha <= 1:
            raise UserInputError(
                f"--distillation_alpha must be in [0, 1], got {self.distillation_alpha}. Fix: pass e.g. 0.1 (soft) "
                "or 0.5 (hard)."
            )
        if self.distillation_tau <= 0:
            raise UserInputError(
                f"--distillation_tau must be above 0, got {self.distillation_tau}. Fix: pass e.g. 3 (DeiT's)."
            )

    @property
    def enabled(self) -> bool:
        return self.distillation_type in ("soft", "hard")


def check_teacher_folder(path: str) -> PretrainedConfig:
    """A folder whose config transformers can read, as an image classifier's (its weights are read later): its
    config, or one error line."""
    require_folder("teacher_model", path, TEACHER_FIX)
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError) as err:
        reason = " ".join(str(err).split())[:300]
        raise UserInputError(f"--teacher_model {path!r} could not be read ({reason}). Fix: {TEACHER_FIX}") from None
    if not getattr(config, "id2label", None):
        raise UserInputError(f"--teacher_model {path!r} names no classes (config.id2label). Fix: {TEACHER_FIX}")
    return config
