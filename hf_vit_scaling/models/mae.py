"""Masked-autoencoder (MAE) models: the pretraining model (transformers' `ViTMAEForPreTraining`) built from a ViT
preset, and its encoder loaded into a `ViTForImageClassification` for fine-tuning, every tensor checked.

He et al. 2021, "Masked Autoencoders Are Scalable Vision Learners" (arXiv 2111.06377): the encoder is a plain ViT
that sees only the visible patches; a lightweight decoder (its own width and depth) reconstructs the masked ones.
The encoder of `--model_preset vit-b-16` is exactly the ViT preset's (same `PRESET_FIELDS`); the decoder's sizes
come from `DECODER_PRESETS` (the paper's 512 wide, 8 deep for the standard sizes) unless given.

What transfers to fine-tuning (checked against transformers 5's files): a saved `ViTMAEForPreTraining` writes its
encoder under the names a saved `ViTForImageClassification` uses (`vit.embeddings.*`, `vit.encoder.layer.N.*`,
`vit.layernorm.*`), so `from_pretrained` converts both the same way. Its position table
(`vit.embeddings.position_embeddings`) is the fixed 2-D sin-cos table (a parameter with `requires_grad=False` in
MAE); it is loaded like every other tensor and is trainable in the classifier, as MAE's own fine-tuning does
(`models_vit.py` starts a learnable `pos_embed` from the checkpoint). The decoder (`decoder.*`) is dropped.
"""

import json
import os

from transformers import ViTConfig, ViTMAEConfig

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.log import logger
from hf_vit_scaling.models.weights import shape_problems, some_keys

DECODER_FIELDS = (
    "decoder_hidden_size",
    "decoder_num_hidden_layers",
    "decoder_num_attention_heads",
    "decoder_intermediate_size",
)
# The paper's decoder (512 wide, 8 blocks, 16 heads, MLP 4x) for the standard sizes; half as wide and deep for the
# small ones (a decoder as wide as ViT-Ti's encoder would cost more than it); vit-tiny-cpu's is CPU-sized.
_DECODER_ROWS = {
    "vit-tiny-cpu": (64, 2, 4, 128),
    "vit-ti-16": (256, 4, 8, 1024),
    "vit-s-16": (256, 4, 8, 1024),
    "vit-b-16": (512, 8, 16, 2048),
    "vit-l-16": (512, 8, 16, 2048),
    "vit-h-14": (512, 8, 16, 2048),
}
DECODER_PRESETS: dict[str, dict] = {name: dict(zip(DECODER_FIELDS, row)) for name, row in _DECODER_ROWS.items()}
PRETRAINING_FILENAME = "pretraining.json"  # what an MAE run writes beside its model: the fine-tune's card reads it
ENCODER_PREFIX, DECODER_PREFIX = "vit.", "decoder."


# The encoder's sizes: the fields ViTConfig, ViTMAEConfig and DeiTConfig share, copied from one config to another.
ENCODER_FIELDS = (
    "image_size", "patch_size", "num_channels", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "intermediate_size", "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range",
    "layer_norm_eps", "qkv_bias",
)  # fmt: skip


def mae_config(vit_config: ViTConfig, mask_ratio: float, norm_pix_loss: bool, decoder: dict) -> ViTMAEConfig:
    """A ViTMAEConfig whose encoder is `vit_config` (a preset's, from `presets.preset_config`) and whose decoder has
    the sizes in `decoder` (`DECODER_FIELDS`)."""
    config = ViTMAEConfig(
        **{key: getattr(vit_config, key) for key in ENCODER_FIELDS},
        mask_ratio=mask_ratio,
        norm_pix_loss=norm_pix_loss,
        **decoder,
    )
    if config.decoder_hidden_size % config.decoder_num_attention_heads:
        raise UserInputError(
            f"--decoder_hidden_size {config.decoder_hidden_size} is not a multiple of --decoder_num_attention_heads "
            f"{config.decoder_num_attention_heads}. Fix: pick a width the heads divide."
        )
    config._attn_implementation = vit_config._attn_implementation
    return config


def is_mae_checkpoint(name_or_path: str) -> bool:
    """A local folder whose config.json is a ViTMAE's."""
    path = os.path.join(name_or_path, "config.json")
    if not os.path.isfile(path):
        return False
    with open(path, encoding="utf-8") as f:
        return json.load(f).get("model_type") == "vit_mae"


def vit_config_from_mae(config: ViTMAEConfig) -> ViTConfig:
    """The classifier whose encoder is the MAE's: the same sizes (ViTConfig's fields), no masking, no decoder."""
    return ViTConfig(**{key: getattr(config, key) for key in ENCODER_FIELDS})


def split_mae_state_dict(state_dict: dict) -> tuple[dict, dict]:
    """(encoder tensors, decoder tensors) of a saved ViTMAEForPreTraining, by key prefix; any other key is an error
    (not an MAE checkpoint)."""
    encoder = {k: v for k, v in state_dict.items() if k.startswith(ENCODER_PREFIX)}
    decoder = {k: v for k, v in state_dict.items() if k.startswith(DECODER_PREFIX)}
    other = set(state_dict) - set(encoder) - set(decoder)
    if other:
        raise UserInputError(
            f"the MAE checkpoint holds {len(other)} tensor(s) outside its encoder and decoder: {some_keys(other)}. "
            "Fix: pass a folder saved by recipes/pretrain_mae.py (ViTMAEForPreTraining.save_pretrained)."
        )
    return encoder, decoder


def expected_encoder_shapes(vit_config: ViTConfig) -> dict[str, tuple]:
    """{saved key: shape} of every encoder tensor a `ViTForImageClassification` of this config saves (transformers'
    on-disk names, which the MAE's encoder shares): what an MAE checkpoint must hold, checked before loading."""
    import torch
    from transformers import ViTForImageClassification
    from transformers.core_model_loading import revert_weight_conversion

    from hf_vit_scaling.models.zero3 import zero3_init_off

    with torch.device("meta"), zero3_init_off():  # shapes only: no memory, whole under ZeRO-3 too
        model = ViTForImageClassification(vit_config)
    saved = revert_weight_conversion(model, model.state_dict())  # the names `save_pretrained` writes
    return {k: tuple(v.shape) for k, v in saved.items() if k.startswith(ENCODER_PREFIX)}


def check_encoder_tensors(name_or_path: str, encoder: dict, expected: dict[str, tuple]) -> None:
    """Every encoder tensor the classifier needs is in the checkpoint with its shape, and nothing else: else one
    `UserInputError` naming the keys."""
    words = (
        "encoder tensor(s) missing",
        "tensor(s) the encoder does not have",
        "encoder tensor(s) of the wrong shape",
    )
    problems = shape_problems(expected, encoder, words)
    if problems:
        raise UserInputError(
            f"--model_name_or_path {name_or_path!r} (an MAE checkpoint) does not hold the whole encoder of its "
            f"config: {problems}. Fix: pass the output folder of a finished recipes/pretrain_mae.py "
            "run (its config.json and model.safetensors together)."
        )


def load_mae_encoder_for_finetuning(
    name_or_path: str, label_names: list[str], labels: dict, read_state_dict, attn_implementation: str = "sdpa"
):
    """A `ViTForImageClassification` whose encoder is the MAE checkpoint's, every tensor checked, with a new head
    for `label_names`; logs one line with the counts. `labels`: the label maps (`presets.label_maps`);
    `read_state_dict()`: the checkpoint's tensors (saved names)."""
    from transformers import ViTForImageClassification

    config = vit_config_from_mae(ViTMAEConfig.from_pretrained(name_or_path))
    config.update(labels)
    encoder, decoder = split_mae_state_dict(read_state_dict())
    check_encoder_tensors(name_or_path, encoder, expected_encoder_shapes(config))
    model, info = ViTForImageClassification.from_pretrained(
        None, config=config, state_dict=encoder, attn_implementation=attn_implementation, output_loading_info=True
    )
    new = sorted(info["missing_keys"])
    if info["unexpected_keys"] or any(not key.startswith("classifier.") for key in new):
        raise UserInputError(
            f"--model_name_or_path {name_or_path!r}: loading the MAE encoder left tensors unplaced "
            f"(missing {some_keys(new)}; unexpected {some_keys(info['unexpected_keys'])}). Fix: pass the output "
            "folder of a recipes/pretrain_mae.py run."
        )
    logger.info(
        f"Loaded {len(encoder)}/{len(encoder)} encoder tensors from the MAE checkpoint {name_or_path}; "
        f"dropped {len(decoder)} decoder tensors; new: {', '.join(new)}"
    )
    return model


def pretraining_summary(name_or_path: str) -> str | None:
    """One line naming an MAE pretraining run (its folder's `pretraining.json`), for a fine-tuned model's card; None
    when the folder has none."""
    path = os.path.join(name_or_path, PRETRAINING_FILENAME)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        run = json.load(f)
    knn = run.get("knn_accuracy")
    knn_text = f", k-NN accuracy {knn:.4f}" if isinstance(knn, (int, float)) else ""
    return (
        f"MAE {name_or_path} ({run.get('model', '?')}, mask ratio {run.get('mask_ratio')}, "
        f"norm_pix_loss {run.get('norm_pix_loss')}, {run.get('steps')} steps on {run.get('dataset', '?')}"
        f"{knn_text})"
    )
