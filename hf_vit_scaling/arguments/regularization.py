"""`RegularizationArguments`: the regularization flags, named as timm/DeiT name them, all off by default.

Label smoothing is TrainingArguments' own `--label_smoothing_factor` (not repeated here). With the BatchAugmenter's
loss in place it is applied to the one-hot targets before Mixup/CutMix, as timm's `Mixup` does, and the Trainer's
`LabelSmoother` does not run (see `hf_vit_scaling.regularization.batch_augmenter`).

DeiT-S/16 on ImageNet (Touvron et al. 2021) for reference: --mixup_alpha 0.8 --cutmix_alpha 1.0 --mixup_prob 1.0
--mixup_switch_prob 0.5 --label_smoothing_factor 0.1 --rand_augment rand-m9-mstd0.5-inc1 --random_erasing 0.25
--drop_path_rate 0.1 (and repeated augmentation x3, not provided here).
"""

import math
from dataclasses import dataclass, field

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.losses.soft_target import mixes_images
from hf_vit_scaling.parallel.deepspeed_config import NO_DEEPSPEED, ConfigReading
from hf_vit_scaling.regularization.rand_augment import RAND_AUGMENT_EXAMPLE, parse_rand_augment


@dataclass
class RegularizationArguments:
    """Regularization in training only: batch augmentations on the device, stochastic depth, EMA, layer decay."""

    mixup_alpha: float = field(
        default=0.0,
        metadata={
            "help": "Mixup (Zhang et al. 2018): blend a training image with its partner in the batch, weight "
            "lam ~ Beta(alpha, alpha) drawn per image, and their targets alike. 0: off. DeiT: 0.8. "
            "(timm: --mixup)"
        },
    )
    cutmix_alpha: float = field(
        default=0.0,
        metadata={
            "help": "CutMix (Yun et al. 2019): paste a box of the partner image, area 1 - lam with lam ~ "
            "Beta(alpha, alpha) per image; targets mixed by the exact pasted area. 0: off. DeiT: 1.0. "
            "(timm: --cutmix)"
        },
    )
    mixup_prob: float = field(
        default=1.0,
        metadata={
            "help": "Probability that a training image is mixed (Mixup or CutMix) when either is on. "
            "(timm: --mixup-prob)"
        },
    )
    mixup_switch_prob: float = field(
        default=0.5,
        metadata={
            "help": "With both Mixup and CutMix on: probability that an image gets CutMix rather than Mixup. "
            "(timm: --mixup-switch-prob)"
        },
    )
    rand_augment: str | None = field(
        default=None,
        metadata={
            "help": "RandAugment (Cubuk et al. 2020) in timm's notation, per image on the device: "
            f"'{RAND_AUGMENT_EXAMPLE}' (DeiT) = magnitude 9 of 10 with N(9, 0.5) noise, 2 ops per image each "
            "applied with p 0.5, ops that grow stronger with m. Keys: m, n, mstd, mmax, inc, p. 'trivial': "
            "TrivialAugment's sampling (Müller & Hutter 2021): one op, uniform strength, always applied. "
            "(timm: --aa)"
        },
    )
    random_erasing: float = field(
        default=0.0,
        metadata={
            "help": "Random erasing (Zhong et al. 2020): probability that a training image gets one box (2-33%% "
            "of its area, aspect 0.3-3.3) replaced by per-pixel Gaussian noise. DeiT: 0.25. (timm: --reprob)"
        },
    )
    drop_path_rate: float = field(
        default=0.0,
        metadata={
            "help": "Stochastic depth (Huang et al. 2016): in training each block's attention and MLP branch is "
            "dropped per image with probability rate x i / (L - 1) for block i (DeiT); kept branches are scaled "
            "by 1 / (1 - p). Evaluation and the saved model are unchanged. DeiT-S: 0.1. (timm: --drop-path)"
        },
    )
    ema_decay: float | None = field(
        default=None,
        metadata={
            "help": "Keep an exponential moving average of the weights, ema = d ema + (1 - d) w after each "
            "optimizer step (it averages about the last 1 / (1 - d) steps: keep that well below the run's "
            "length). Evaluated as eval_ema_*, saved to output_dir/ema/ beside the trained model, resumed from "
            "each checkpoint. Plain DDP and ZeRO 0-2. (timm: --model-ema-decay)"
        },
    )
    layer_decay: float | None = field(
        default=None,
        metadata={
            "help": "Layer-wise lr decay for fine-tuning (BEiT, Bao et al. 2022): a block's lr is lr x "
            "decay^(L + 1 - id), id 0 for the embeddings, i + 1 for block i, L + 1 for the head. ViT-B: "
            "0.65-0.75. Needs the Trainer's optimizer (no 'optimizer'/'scheduler' in the ds_config). The groups "
            "and their lrs: output_dir/layer_decay_groups.json. (timm: --layer-decay)"
        },
    )
    eval_crop_pct: float | None = field(
        default=None,
        metadata={
            "help": "Evaluation crop as timm's crop_pct: resize the shorter side to image_size / crop_pct, "
            "keep the centre image_size x image_size (0.875: 224 from 256). Default: resize only. Needs the "
            "device input path. (timm: --crop-pct)"
        },
    )

    def __post_init__(self):
        for flag in ("mixup_alpha", "cutmix_alpha"):
            value = getattr(self, flag)
            if not (math.isfinite(value) and value >= 0):
                raise UserInputError(f"--{flag} must be >= 0 (0 turns it off), got {value}. Fix: e.g. --{flag} 0.8.")
        for flag in ("mixup_prob", "mixup_switch_prob", "random_erasing"):
            value = getattr(self, flag)
            if not 0.0 <= value <= 1.0:
                raise UserInputError(
                    f"--{flag} is a probability and must be in [0, 1], got {value}. Fix: pass a value between 0 and 1."
                )
        if not 0.0 <= self.drop_path_rate < 1.0:
            raise UserInputError(
                f"--drop_path_rate must be in [0, 1) (1 would drop every branch), got "
                f"{self.drop_path_rate}. Fix: e.g. --drop_path_rate 0.1."
            )
        if self.ema_decay is not None and not 0.0 < self.ema_decay < 1.0:
            raise UserInputError(
                f"--ema_decay must be in (0, 1), got {self.ema_decay}. Fix: e.g. --ema_decay 0.999 "
                "(averages about the last 1,000 steps), or leave it out."
            )
        if self.layer_decay is not None and not 0.0 < self.layer_decay <= 1.0:
            raise UserInputError(
                f"--layer_decay must be in (0, 1] (1 = the same lr everywhere), got "
                f"{self.layer_decay}. Fix: e.g. --layer_decay 0.75."
            )
        if self.eval_crop_pct is not None and not 0.0 < self.eval_crop_pct <= 1.0:
            raise UserInputError(
                f"--eval_crop_pct must be in (0, 1], got {self.eval_crop_pct}. "
                "Fix: e.g. --eval_crop_pct 0.875, or leave it out (resize only)."
            )
        if self.rand_augment is not None:
            parse_rand_augment(self.rand_augment)

    @property
    def mixes(self) -> bool:
        return mixes_images(self.mixup_alpha, self.cutmix_alpha, self.mixup_prob)


def check_regularization(args: RegularizationArguments, ds_config: ConfigReading = NO_DEEPSPEED) -> None:
    """Refuse combinations that cannot work, at parse time, before any expensive work (`ds_config`: the run's DeepSpeed
    config as its Engine read it, `Engine.reading`; the default: no DeepSpeed). What only the run knows is
    checked where it is decided: the EMA of a resumed checkpoint (`regularization.ema.check_ema_resumable`), the eval
    crop on the chosen input path (`data.input_path.InputPath.check_eval_crop`)."""
    if args.ema_decay is not None and ds_config.zero_stage == 3:
        raise UserInputError(
            "--ema_decay works with plain DDP and ZeRO 0-2; ZeRO-3 keeps only a shard of each "
            "parameter per rank. Fix: use --ds_config ds_configs/zero2.json, or drop --ema_decay."
        )
    if args.layer_decay is not None:
        own = list(ds_config.own_sections)
        if own:
            raise UserInputError(
                f"--layer_decay sets per-group learning rates in the Trainer's optimizer, but the "
                f"ds_config builds its own {' and '.join(own)}. Fix: remove the {own} section(s) "
                "from the ds_config (the Trainer then builds both), or drop --layer_decay."
            )
