"""The MAE pretraining group (recipes/pretrain_mae.py only): masking, the decoder's sizes, the k-NN progress metric
and the reconstruction picture. The encoder is the `--model_preset` ViT (the model group)."""

from dataclasses import dataclass, field

from hf_vit_scaling.arguments.field_checks import require_at_least
from hf_vit_scaling.errors import UserInputError

KNN_FEATURES = ("cls", "mean")


@dataclass
class MaeArguments:
    """Masked-autoencoder pretraining (He et al. 2021, arXiv 2111.06377) of the preset's ViT encoder."""

    mask_ratio: float = field(
        default=0.75,
        metadata={"help": "Fraction of the patches hidden from the encoder, in (0, 1). The paper's default: 0.75."},
    )
    norm_pix_loss: bool = field(
        default=True,
        metadata={
            "help": "Reconstruct each patch's pixels normalised by the patch's own mean and variance (the paper's "
            "better-representation setting); false: the raw (processor-normalised) pixels."
        },
    )
    decoder_hidden_size: int | None = field(
        default=None,
        metadata={"help": "Decoder width. Default: the preset's decoder (vit-b-16: 512; vit-tiny-cpu: 64)."},
    )
    decoder_num_hidden_layers: int | None = field(
        default=None, metadata={"help": "Decoder depth in transformer blocks. Default: the preset's (vit-b-16: 8)."}
    )
    decoder_num_attention_heads: int | None = field(
        default=None,
        metadata={"help": "Decoder attention heads; must divide --decoder_hidden_size. Default: the preset's."},
    )
    decoder_intermediate_size: int | None = field(
        default=None, metadata={"help": "Decoder MLP width. Default: the preset's (4 x its width)."}
    )
    knn_eval_steps: int = field(
        default=0,
        metadata={
            "help": "Every this many optimizer steps, and at the end, log eval_knn_accuracy: k-NN classification of "
            "unmasked encoder features of --knn_eval_samples validation images against --knn_train_samples "
            "labelled training images (also the reconstruction loss on the validation split). 0: at the end only."
        },
    )
    knn_train_samples: int = field(
        default=1000, metadata={"help": "Labelled training images whose features form the k-NN memory bank."}
    )
    knn_eval_samples: int = field(
        default=500, metadata={"help": "Validation images classified by k-NN (their labels are the answer)."}
    )
    knn_k: int = field(default=20, metadata={"help": "Neighbours per vote (DINO's and MAE's k-NN protocol: 20)."})
    knn_temperature: float = field(
        default=0.07,
        metadata={"help": "Votes are weighted by exp(cosine similarity / T), as DINO's k-NN (T = 0.07)."},
    )
    knn_features: str = field(
        default="cls",
        metadata={
            "help": "Feature of an image: cls (the encoder's CLS token) or mean (mean of its patch tokens).",
            "choices": list(KNN_FEATURES),
        },
    )
    reconstruction_images: int = field(
        default=8,
        metadata={
            "help": "Held-out (validation) images drawn at the end as original / masked / reconstructed rows in "
            "output_dir/reconstructions.png. 0: no picture."
        },
    )

    def __post_init__(self):
        if not 0 < self.mask_ratio < 1:  # also nan
            raise UserInputError(
                f"--mask_ratio must be in (0, 1), got {self.mask_ratio}. Fix: pass a fraction such as 0.75."
            )
        require_at_least(
            self,
            1,
            "decoder_hidden_size",
            "decoder_num_hidden_layers",
            "decoder_num_attention_heads",
            "decoder_intermediate_size",
            "knn_train_samples",
            "knn_eval_samples",
            "knn_k",
        )
        require_at_least(self, 0, "knn_eval_steps", "reconstruction_images")
        if not self.knn_temperature > 0:
            raise UserInputError(
                f"--knn_temperature must be positive, got {self.knn_temperature}. Fix: pass e.g. 0.07."
            )
        if (
            self.decoder_hidden_size
            and self.decoder_num_attention_heads
            and self.decoder_hidden_size % self.decoder_num_attention_heads
        ):
            raise UserInputError(
                f"--decoder_hidden_size {self.decoder_hidden_size} is not a multiple of --decoder_num_attention_heads "
                f"{self.decoder_num_attention_heads}. Fix: pick a width the heads divide."
            )

    def decoder(self, preset: str) -> dict:
        """The decoder's sizes: the preset's (`models.mae.DECODER_PRESETS`) with the flags given on top."""
        from hf_vit_scaling.models.mae import DECODER_FIELDS, DECODER_PRESETS

        sizes = dict(DECODER_PRESETS[preset])
        sizes.update({key: getattr(self, key) for key in DECODER_FIELDS if getattr(self, key) is not None})
        return sizes


def check_mae_run(args) -> None:
    """What MAE pretraining cannot take from the shared groups, in one error naming every such flag given: a
    checkpoint to start from, a CNN, a teacher, the classification-only flags (label mixing, class weights, label
    smoothing, sequence parallelism, EMA), the fine-tuning ones (drop path and layer decay act on a classifier's
    ViT blocks) and ViT weight inits (MAE starts from its own: fixed sin-cos tables)."""
    from hf_vit_scaling.arguments.field_checks import refuse_given_flags

    if args.model.model_name_or_path:
        raise UserInputError(
            "--model_name_or_path with recipes/pretrain_mae.py: MAE pretraining starts from a preset's random "
            "encoder. Fix: pass --model_preset (e.g. vit-tiny-cpu); fine-tune the result with recipes/train_vit.py "
            "--model_name_or_path <this run's output_dir>."
        )
    reg = args.regularization
    classification_only = [
        (f"--model_preset {args.model.preset} (a CNN)", args.model.is_cnn),
        ("--teacher_model", bool(args.distillation.teacher_model)),
        ("--mixup_alpha", reg.mixup_alpha > 0),
        ("--cutmix_alpha", reg.cutmix_alpha > 0),
        ("--class_weighting", args.data.class_weighting != "none"),
        ("--label_smoothing_factor", args.training.label_smoothing_factor > 0),
        ("--sequence_parallel_size", args.engine.sequence_parallel_size > 1),
        ("--ema_decay", reg.ema_decay is not None),
        ("--drop_path_rate", reg.drop_path_rate > 0),
        ("--layer_decay", reg.layer_decay is not None),
        ("--weight_init", args.model.weight_init != "hf"),
        ("--position_embedding_init", args.model.position_embedding_init != "random"),
    ]
    refuse_given_flags(
        classification_only,
        lambda flags: f"{flags}: not for MAE pretraining (no labels, a ViT encoder, one model). Fix: drop {flags}.",
    )
