"""The model group: preset or checkpoint, image and patch size, config overrides, weight init."""

import os
from dataclasses import dataclass, field

from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id
from transformers import ViTConfig

from hf_vit_scaling.arguments.field_checks import refuse_given_flags, require_at_least, require_folder
from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.models.presets import (
    ALL_PRESETS,
    CNN_PRESETS,
    DEFAULT_PRESET,
    MODEL_PRESETS,
    check_config_overrides,
)
from hf_vit_scaling.models.weight_init import POSITION_EMBEDDING_INITS, WEIGHT_INITS, check_sincos_width


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
            "help": "Train from scratch with a standard size: " + ", ".join(ALL_PRESETS) + ". "
            "Default when --model_name_or_path is not given: vit-tiny-cpu. " + " and ".join(CNN_PRESETS) + " are CNNs "
            "(transformers' ResNet and RegNetY), e.g. a teacher for --teacher_model.",
            "choices": list(ALL_PRESETS),
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
        if self.model_name_or_path:
            check_model_path(self.model_name_or_path)
        require_folder("cache_dir", self.cache_dir, "pass a folder for Hub downloads (made if absent).", created=True)
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
        if self.preset in CNN_PRESETS:
            check_cnn_preset(self)
        if self.position_embedding_init == "sincos2d" and self.preset:
            config = ViTConfig(**MODEL_PRESETS[self.preset])
            if self.config_overrides:
                check_config_overrides(self.config_overrides, config)
            check_sincos_width(config.hidden_size)

    @property
    def is_cnn(self) -> bool:
        return self.preset in CNN_PRESETS

    @property
    def preset(self) -> str | None:
        """The preset that trains from scratch (the default one when no checkpoint is given), else None."""
        return None if self.model_name_or_path else (self.model_preset or DEFAULT_PRESET)


def check_cnn_preset(model_args) -> None:
    """A CNN preset has no patches, attention or ViTConfig: refuse the model flags that only a ViT reads."""
    vit_only = [
        ("--patch_size", model_args.patch_size is not None),
        ("--config_overrides", bool(model_args.config_overrides)),
        ("--weight_init", model_args.weight_init != "hf"),
        ("--position_embedding_init", model_args.position_embedding_init != "random"),
        ("--attn_implementation", model_args.attn_implementation != "sdpa"),
    ]
    refuse_given_flags(
        vit_only,
        lambda flags: (
            f"{flags} appl(y/ies) to a ViT, and --model_preset {model_args.preset} is a CNN. Fix: drop {flags}."
        ),
    )


MODEL_PATH_FIX = "pass a saved model's folder (config.json, weights) or a Hub id such as google/vit-base-patch16-224."


def check_model_path(name_or_path: str) -> None:
    """A local folder, or else a Hub id (`name` or `owner/name`, left to the Hub: no network here). A file, or a
    path that exists nowhere and cannot be a Hub id (./x, /x, ~/x, a/b/c), is refused by name."""
    if os.path.isdir(name_or_path):
        return
    if os.path.exists(name_or_path):
        raise UserInputError(f"--model_name_or_path {name_or_path!r} is a file, not a folder. Fix: {MODEL_PATH_FIX}")
    try:
        validate_repo_id(name_or_path)
    except HFValidationError:
        raise UserInputError(
            f"--model_name_or_path {name_or_path!r} does not exist (no such folder, and not a Hub id owner/name). "
            f"Fix: {MODEL_PATH_FIX}"
        ) from None
