"""`build_model`: the recipes' model, from scratch (a preset) or from a checkpoint (a new head)."""

from transformers import AutoImageProcessor

from hf_vit_scaling.models.presets import (
    build_model_from_preset,
    image_processor_for,
    is_cnn,
    load_model_for_finetuning,
    preset_config,
    with_distillation_token,
)
from hf_vit_scaling.models.weight_init import describe_init, initialize_weights


def config_from_model_args(model_args, label_names: list[str]):
    """The preset's config with --image_size, --patch_size, --attn_implementation and --config_overrides applied."""
    m = model_args
    return preset_config(m.preset, label_names, m.image_size, m.patch_size, m.attn_implementation, m.config_overrides)


def build_model(model_args, label_names: list[str], distillation_token: bool = False):
    """From scratch (preset) or from a checkpoint (new head). Returns (model, image processor, description).
    `distillation_token` (presets only): the preset's sizes as transformers' DeiTForImageClassificationWithTeacher."""
    if model_args.model_name_or_path:
        # --image_size with a checkpoint: high-resolution fine-tuning, position embeddings interpolated once.
        name = model_args.model_name_or_path
        model = load_model_for_finetuning(
            name,
            label_names,
            model_args.model_revision,
            model_args.cache_dir,
            model_args.attn_implementation,
            model_args.image_size,
        )
        processor = AutoImageProcessor.from_pretrained(
            name, revision=model_args.model_revision, cache_dir=model_args.cache_dir
        )
        if model_args.image_size:
            processor.size = {"height": model_args.image_size, "width": model_args.image_size}
        return model, processor, f"fine-tuned from {name}"
    config = config_from_model_args(model_args, label_names)
    changed = f" ({model_args.config_overrides})" if model_args.config_overrides else ""
    processor = image_processor_for(config)
    if distillation_token:
        config = with_distillation_token(config)
        changed += " with a distillation token (DeiT)"
    model = build_model_from_preset(config)
    if is_cnn(config):  # the ViT weight inits do not apply (check_cnn_preset refused their flags)
        return model, processor, f"{model_args.preset} (CNN) trained from scratch"
    initialize_weights(model, model_args.weight_init, model_args.position_embedding_init)
    init = describe_init(model_args.weight_init, model_args.position_embedding_init)
    return model, processor, f"{model_args.preset}{changed} trained from scratch{init}"
