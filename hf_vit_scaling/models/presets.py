"""ViT model presets (train from scratch) and checkpoint loading with a new head (fine-tune), ZeRO-3 safe."""

import json
import os
import re

import torch
from huggingface_hub.errors import EntryNotFoundError
from transformers import (
    AutoConfig,
    AutoModelForImageClassification,
    DeiTConfig,
    DeiTForImageClassificationWithTeacher,
    PretrainedConfig,
    ViTConfig,
    ViTForImageClassification,
)
from transformers.utils import cached_file, is_torchvision_available

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.log import logger
from hf_vit_scaling.models.flops import has_patches
from hf_vit_scaling.models.mae import ENCODER_FIELDS, is_mae_checkpoint, load_mae_encoder_for_finetuning
from hf_vit_scaling.models.weights import read_state_dict, some_keys

# Standard sizes: ViT-B/L/H from Dosovitskiy et al. 2021 (Table 1), Ti/S from DeiT (Touvron et al. 2021).
# vit-tiny-cpu is CPU-sized, for tests and the README's main job: 32 px, patch 4 -> 64 patches + CLS = 65 tokens.
# vit-b-16 is the study's model: 224 px, 86 M parameters.
PRESET_FIELDS = (
    "image_size",
    "patch_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
)
_PRESET_ROWS = {
    "vit-tiny-cpu": (32, 4, 96, 4, 4, 192),
    "vit-ti-16": (224, 16, 192, 12, 3, 768),
    "vit-s-16": (224, 16, 384, 12, 6, 1536),
    "vit-b-16": (224, 16, 768, 12, 12, 3072),
    "vit-l-16": (224, 16, 1024, 24, 16, 4096),
    "vit-h-14": (224, 14, 1280, 32, 16, 5120),
}
MODEL_PRESETS: dict[str, dict] = {name: dict(zip(PRESET_FIELDS, row)) for name, row in _PRESET_ROWS.items()}
DEFAULT_PRESET = "vit-tiny-cpu"

# CNN teachers for distillation (DeiT's point: a CNN's locality helps on small data), as transformers' ResNet and
# RegNet (DeiT's teachers were RegNetY). `image_size` is the recipe's input side (a CNN itself takes any size): kept in
# the config for the input path, the processor and the card.
# resnet-tiny-cpu: ResNet's stem (7x7 stride-2 conv + 3x3 stride-2 max pool: /4), then one basic block per stage at
# widths 32, 64, 128 (stages 2 and 3 halve the size): 32 px -> 8 -> 4 -> 2, then global pooling and a linear head;
# 0.31 M parameters with 10 classes.
# regnety-small-cpu: RegNet's stem is a single 3x3 stride-2 conv (/2, no pool), so a 28 px image keeps 14x14 into the
# first stage (ResNet's stem leaves 7x7); then Y blocks (grouped 3x3 conv, group width 16, squeeze-excitation) at
# widths 48, 96, 192 with depths 1, 2, 3, each stage halving: 28 px -> 14 -> 7 -> 4 -> 2; 0.44 M parameters with 10
# classes.
CNN_PRESETS: dict[str, dict] = {
    "resnet-tiny-cpu": {"model_type": "resnet", "image_size": 32, "embedding_size": 32, "hidden_sizes": [32, 64, 128],
                        "depths": [1, 1, 1], "layer_type": "basic"},
    "regnety-small-cpu": {"model_type": "regnet", "image_size": 32, "embedding_size": 32,
                          "hidden_sizes": [48, 96, 192], "depths": [1, 2, 3], "groups_width": 16, "layer_type": "y"},
}  # fmt: skip
ALL_PRESETS = (*MODEL_PRESETS, *CNN_PRESETS)


def is_cnn(config) -> bool:
    """A model without patches (a CNN preset's config, or any saved classifier without `patch_size`)."""
    return not has_patches(config)


def cnn_preset_config(preset: str, label_names: list[str], image_size: int | None = None) -> PretrainedConfig:
    """A ResNetConfig or RegNetConfig for a CNN preset, with the dataset's labels and input side."""
    values = dict(CNN_PRESETS[preset])
    values["image_size"] = image_size or values["image_size"]
    return AutoConfig.for_model(values.pop("model_type"), num_channels=3, **values, **label_maps(label_names))


HEAD_PREFIXES = ("classifier.",)


def label_maps(label_names: list[str]) -> dict:
    """The config's classes, and its problem type: the recipe trains single-label classifiers on integer labels.
    Left unset, transformers' loss writes `config.problem_type` on the first training forward
    (`ForSequenceClassificationLoss`); under --torch_compile that write fails the compiled graph's guard
    (`config.problem_type is None`) and the whole model is compiled a second time at step 2."""
    return {
        "num_labels": len(label_names),
        "id2label": {i: name for i, name in enumerate(label_names)},
        "label2id": {name: i for i, name in enumerate(label_names)},
        "problem_type": "single_label_classification",
    }


def check_config_overrides(overrides: str, config: ViTConfig | None = None) -> ViTConfig:
    """Apply `--config_overrides` ("key=value,...", transformers' `update_from_string`) to `config` (a default
    ViTConfig when None), refusing unknown keys, bad values and a hidden size the heads do not divide."""
    config = config or ViTConfig()
    try:
        config.update_from_string(overrides)
    except ValueError as err:  # also a pair without "=": dict() of a one-element split
        raise UserInputError(
            f"--config_overrides {overrides!r}: {err}. Fix: comma-separated key=value pairs of ViTConfig fields, e.g. "
            "hidden_size=128,num_hidden_layers=6."
        ) from None
    if config.hidden_size % config.num_attention_heads:
        raise UserInputError(
            f"--config_overrides gives hidden_size {config.hidden_size}, which {config.num_attention_heads} attention "
            "heads do not divide. Fix: make hidden_size a multiple of num_attention_heads."
        )
    return config


def preset_config(
    preset: str,
    label_names: list[str],
    image_size: int | None = None,
    patch_size: int | None = None,
    attn_implementation: str = "sdpa",
    config_overrides: str | None = None,
) -> ViTConfig:
    """A ViTConfig for a named preset (a CNN's config for a CNN preset), with the dataset's labels, optional
    resolution overrides and `--config_overrides`."""
    if preset in CNN_PRESETS:
        return cnn_preset_config(preset, label_names, image_size)
    if preset not in MODEL_PRESETS:
        raise UserInputError(f"--model_preset {preset!r} is unknown. Fix: use one of {', '.join(ALL_PRESETS)}.")
    values = dict(MODEL_PRESETS[preset])
    values["image_size"] = image_size or values["image_size"]
    values["patch_size"] = patch_size or values["patch_size"]
    config = ViTConfig(**values, **label_maps(label_names))
    if config_overrides:
        check_config_overrides(config_overrides, config)
    if config.image_size % config.patch_size:
        raise UserInputError(
            f"--patch_size {config.patch_size} does not divide --image_size {config.image_size}. "
            "Fix: pick sizes where image_size is a multiple of patch_size."
        )
    config._attn_implementation = attn_implementation
    return config


def with_distillation_token(config: ViTConfig) -> DeiTConfig:
    """The preset's ViT as a DeiT with a distillation token (`DeiTForImageClassificationWithTeacher`): the same
    sizes and classes, one more token (the sequence is patches + 2) and a second head. Evaluation reads only `logits`
    (the two heads' average, DeiT's inference), so the Trainer is told to leave the two heads' own outputs out."""
    keep = (*ENCODER_FIELDS, "num_labels", "id2label", "label2id", "problem_type")
    deit = DeiTConfig(**{key: getattr(config, key) for key in keep})
    deit.keys_to_ignore_at_inference = ["cls_logits", "distillation_logits"]
    deit._attn_implementation = config._attn_implementation
    return deit


def _from_config(config):
    """The config's model, random-initialised: a DeiT config is the two-head student (the Auto class would build
    DeiT's one-head model), every other config its AutoModelForImageClassification."""
    if isinstance(config, DeiTConfig):
        model = DeiTForImageClassificationWithTeacher._from_config(
            config, attn_implementation=config._attn_implementation
        )
        # transformers starts DeiT's class and distillation tokens and position embeddings at zero: two identical
        # zero tokens, whose first LayerNorm divides by sqrt(0 + eps) (measured: gradient norm 1.8e4 at step 1 on
        # vit-tiny-cpu, against 8 for the ViT). DeiT (facebookresearch/deit models.py) draws all three from a
        # truncated normal of std 0.02, as transformers' ViT does.
        embeddings = model.deit.embeddings
        with torch.no_grad():
            for tensor in (embeddings.cls_token, embeddings.distillation_token, embeddings.position_embeddings):
                torch.nn.init.trunc_normal_(tensor, std=config.initializer_range)
        return model
    if getattr(config, "model_type", None) == "vit_mae":  # MAE pretraining (recipes/pretrain_mae.py)
        from transformers import ViTMAEForPreTraining

        model = ViTMAEForPreTraining._from_config(config, attn_implementation=config._attn_implementation)
        from transformers.integrations import is_deepspeed_zero3_enabled

        if not is_deepspeed_zero3_enabled():  # under ZeRO-3 the host-built model's weights are copied in whole
            _start_mae_embeddings(model)
        # Its loss is a mean over the micro-batch's masked patches, not a sum to normalise by a count of label
        # items: the Trainer must not pass `num_items_in_batch` (the forward's **kwargs would take it).
        model.accepts_loss_kwargs = False
        return model
    if is_cnn(config):  # convolutions: no attention kernel to choose
        return AutoModelForImageClassification.from_config(config)
    return AutoModelForImageClassification.from_config(config, attn_implementation=config._attn_implementation)


def mae_sincos_table(grid: int, dim: int) -> torch.Tensor:
    """MAE's fixed position table (1, 1 + grid², dim): a zero row for the CLS token, then 2-D sine-cosine
    embeddings of the patch grid, in the order MAE's released weights use (transformers' `ViTMAEEmbeddings`)."""
    from transformers.models.vit_mae.modeling_vit_mae import build_2d_sinusoidal_position_embedding

    table = build_2d_sinusoidal_position_embedding(height=grid, width=grid, embed_dim=dim, cls_token=True)
    half = table.shape[-1] // 2  # MAE's code swapped h and w: [sin_w|cos_w|sin_h|cos_h], which its weights keep
    return torch.cat([table[..., half:], table[..., :half]], dim=-1).reshape(1, -1, dim)


def _start_mae_embeddings(model) -> None:
    """MAE's starting embeddings (facebookresearch/mae models_mae.py `initialize_weights`): fixed 2-D sine-cosine
    position tables in the encoder and the decoder, CLS and mask tokens from N(0, 0.02²). transformers 5.x leaves all
    four at zero (its decoder init zeroes the table; the encoder's is skipped once the patch projection is marked
    initialised): with every position and the mask token alike, the decoder cannot tell which patch to rebuild and
    predicts the mean (measured: loss flat at 0.79 on Fashion-MNIST for 1,000 steps, k-NN accuracy 0.36)."""
    embeddings, decoder = model.vit.embeddings, model.decoder
    grid = int(embeddings.patch_embeddings.num_patches**0.5)
    with torch.no_grad():
        embeddings.position_embeddings.copy_(mae_sincos_table(grid, embeddings.position_embeddings.shape[-1]))
        decoder.decoder_pos_embed.copy_(mae_sincos_table(grid, decoder.decoder_pos_embed.shape[-1]))
        torch.nn.init.normal_(embeddings.cls_token, std=model.config.initializer_range)
        torch.nn.init.normal_(decoder.mask_token, std=model.config.initializer_range)


def build_model_from_preset(config: ViTConfig) -> ViTForImageClassification:
    """Random-init model, the same weights for the same seed under every engine. `from_config` builds it under
    `deepspeed.zero.Init` when ZeRO-3 is active (`_zero3_model_from_host_init`)."""
    from transformers.integrations import is_deepspeed_zero3_enabled

    if is_deepspeed_zero3_enabled():
        return _zero3_model_from_host_init(config)
    return _from_config(config)


def _zero3_model_from_host_init(config: ViTConfig) -> ViTForImageClassification:
    """Under ZeRO-3 transformers initialises the partitioned model on rank 0, module by module, children first
    (`initialize_weights_zero3`): other draws from the seed than the plain model's init, so ZeRO-3 started from other
    weights than DDP, ZeRO 0-2 and FSDP2 (step-1 loss 2.318 against 2.255 on the tiny preset). So the model is first
    built whole on the host exactly as without ZeRO-3, then built partitioned and given those weights from rank 0;
    the generator is left where the plain build leaves it, so later draws match too. Costs one full fp32 copy of
    the model in host memory per process while it is built (ViT-B/16: 86.6 M x 4 bytes = 0.35 GB; ViT-H/14:
    632 M x 4 bytes = 2.5 GB)."""
    import deepspeed
    from transformers.integrations import deepspeed as hf_deepspeed

    zero3 = hf_deepspeed._hf_deepspeed_config_weak_ref()  # the Trainer's HfDeepSpeedConfig: it turns zero.Init on
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        whole = _from_config(config)
    finally:
        hf_deepspeed.set_hf_deepspeed_config(zero3)
    after_init = torch.get_rng_state()
    model = _from_config(config)
    torch.set_rng_state(after_init)
    weights = whole.state_dict()
    params = dict(model.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values()), modifier_rank=0), torch.no_grad():
        if deepspeed.comm.get_rank() == 0:
            for name, param in params.items():
                param.copy_(weights[name])
    for name, buffer in model.named_buffers():  # buffers are not partitioned: every rank sets its own
        buffer.copy_(weights[name])
    return model


def image_processor_for(config: ViTConfig):
    """The processor saved beside a from-scratch model: resize to the model's size, normalise to [-1, 1].

    The torchvision-backed `ViTImageProcessor` where torchvision is installed, else its PIL twin (same config file).
    """
    if is_torchvision_available():
        from transformers import ViTImageProcessor as processor_class
    else:
        from transformers import ViTImageProcessorPil as processor_class
    size = config.image_size
    return processor_class(size={"height": size, "width": size}, image_mean=[0.5] * 3, image_std=[0.5] * 3)


def _checkpoint_files(name_or_path: str, revision: str, cache_dir: str | None) -> list[str]:
    """Weight files of a checkpoint (local or Hub): safetensors first, sharded or not, else a torch .bin."""
    for single, index in (
        ("model.safetensors", "model.safetensors.index.json"),
        ("pytorch_model.bin", "pytorch_model.bin.index.json"),
    ):
        for filename in (single, index):
            try:
                path = cached_file(
                    name_or_path,
                    filename,
                    revision=revision,
                    cache_dir=cache_dir,
                    _raise_exceptions_for_missing_entries=False,
                )
            except (EntryNotFoundError, OSError):
                path = None
            if path is None:
                continue
            if filename == index:
                with open(path, encoding="utf-8") as f:
                    shards = sorted(set(json.load(f)["weight_map"].values()))
                return [cached_file(name_or_path, shard, revision=revision, cache_dir=cache_dir) for shard in shards]
            return [path]
    raise UserInputError(
        f"--model_name_or_path {name_or_path!r}: no model.safetensors or pytorch_model.bin found. "
        "Fix: pass a ViT checkpoint folder or Hub id (e.g. google/vit-base-patch16-224-in21k)."
    )


def load_backbone_state_dict(
    name_or_path: str, revision: str = "main", cache_dir: str | None = None, keep_head: bool = False
) -> dict:
    """The checkpoint's weights (safetensors, or `weights_only` torch loading), without its classification head
    unless `keep_head`."""
    state_dict = read_state_dict(_checkpoint_files(name_or_path, revision, cache_dir))
    return {k: v for k, v in state_dict.items() if keep_head or not k.startswith(HEAD_PREFIXES)}


def same_labels(saved_id2label: dict, label_names: list[str]) -> bool:
    """Whether a checkpoint's classes are exactly these, in this order (then its head still fits)."""
    return [saved_id2label.get(i) for i in range(len(saved_id2label))] == list(label_names)


def interpolate_position_embeddings(state_dict: dict, config: ViTConfig, image_size: int) -> None:
    """Resize a checkpoint's position table to `image_size` once, in place, with the bicubic interpolation of
    transformers' `ViTEmbeddings.interpolate_pos_encoding` (the CLS entry kept): 224 -> 1024 px at patch 16 turns
    1 + 14 x 14 = 197 entries into 1 + 64 x 64 = 4,097. The saved model then runs at the new size without flags."""
    grid = image_size // config.patch_size
    for key in [k for k in state_dict if k.endswith("embeddings.position_embeddings")]:
        table = state_dict[key]
        old = int(round((table.shape[1] - 1) ** 0.5))
        patches = table[:, 1:].reshape(1, old, old, -1).permute(0, 3, 1, 2).float()
        patches = torch.nn.functional.interpolate(patches, size=(grid, grid), mode="bicubic", align_corners=False)
        patches = patches.permute(0, 2, 3, 1).reshape(1, grid * grid, -1).to(table.dtype)
        state_dict[key] = torch.cat([table[:, :1], patches], dim=1)
    config.image_size = image_size


def load_model_for_finetuning(
    name_or_path: str,
    label_names: list[str],
    revision: str = "main",
    cache_dir: str | None = None,
    attn_implementation: str = "sdpa",
    image_size: int | None = None,
):
    """A pretrained ViT with a new head sized to `label_names`, correct under ZeRO-3 too. A checkpoint trained on
    the same classes in the same order keeps its head (continued training, e.g. at a higher resolution). An MAE
    checkpoint (recipes/pretrain_mae.py) gives its encoder, every tensor checked
    (`mae.load_mae_encoder_for_finetuning`).

    `ignore_mismatched_sizes=True` is not used: under ZeRO-3 the mismatched head is marked as loaded and never
    initialised (transformers issue 17336). Instead the head's keys are dropped from the state dict, so the head is a
    plain missing key, which transformers initialises (gathering the partitioned parameters) in every mode.
    """
    if os.path.isdir(name_or_path) and not os.path.isfile(os.path.join(name_or_path, "config.json")):
        raise UserInputError(
            f"--model_name_or_path {name_or_path!r} has no config.json. Fix: pass a saved model folder."
        )
    if is_mae_checkpoint(name_or_path):  # a recipes/pretrain_mae.py run: its encoder, every tensor checked
        pretrained_size = AutoConfig.from_pretrained(name_or_path).image_size
        if image_size and image_size != pretrained_size:
            raise UserInputError(
                f"--image_size {image_size} with an MAE checkpoint pretrained at {pretrained_size} px "
                f"({name_or_path}): its encoder is fine-tuned at the size it was pretrained at. Fix: drop "
                "--image_size (or pretrain at the size you want)."
            )
        files = _checkpoint_files(name_or_path, revision, cache_dir)
        return load_mae_encoder_for_finetuning(
            name_or_path, label_names, label_maps(label_names), lambda: read_state_dict(files), attn_implementation
        )
    config = ViTConfig.from_pretrained(name_or_path, revision=revision, cache_dir=cache_dir)
    keep_head = same_labels(config.id2label, label_names)
    config.update(label_maps(label_names))  # the data's classes (the head is new unless they are the saved ones)
    if keep_head:
        logger.info(f"{name_or_path} was trained on the same {len(label_names)} classes: its head is kept.")
    state_dict = load_backbone_state_dict(name_or_path, revision, cache_dir, keep_head)
    if image_size and image_size != config.image_size:  # high-resolution fine-tuning from e.g. a 224 px checkpoint
        if image_size % config.patch_size:
            raise UserInputError(
                f"--image_size {image_size} is not a multiple of the checkpoint's patch size "
                f"{config.patch_size}. Fix: pick a multiple of {config.patch_size}."
            )
        interpolate_position_embeddings(state_dict, config, image_size)
    # With `state_dict`, transformers wants no name: the weights come from the dict, the shapes from `config`.
    # `from_pretrained` converts the keys (transformers 5 renamed ViT's modules); it raises on a shape that differs
    # and only warns about missing keys, so these are checked here.
    model, info = ViTForImageClassification.from_pretrained(
        None, config=config, state_dict=state_dict, attn_implementation=attn_implementation, output_loading_info=True
    )
    check_finetuning_load(name_or_path, info, new_head=not keep_head)
    return model


def check_finetuning_load(name_or_path: str, info: dict, new_head: bool) -> None:
    """Every tensor of the model came from the checkpoint, except a new head (label maps differ; logged). A tensor
    the classification model has no place for stops the load too, except a `ViTModel`'s pooler (the pre-logits layer
    that `ViTForImageClassification` does not have; logged): a left-over key means a conversion went wrong."""
    missing = set(info["missing_keys"])
    head = {key for key in missing if key.startswith(HEAD_PREFIXES)} if new_head else set()
    unexpected = set(info["unexpected_keys"])
    pooler = {key for key in unexpected if re.search(r"(^|\.)pooler\.", key)}
    problems = [
        f"{len(keys)} {what}: {some_keys(keys)}"
        for what, keys in (
            ("tensor(s) of the model missing", missing - head),
            ("tensor(s) the model does not have", unexpected - pooler),
        )
        if keys
    ]
    if problems:
        raise UserInputError(
            f"--model_name_or_path {name_or_path!r} does not restore every tensor of the model: "
            f"{'; '.join(problems)}. Fix: pass a ViT checkpoint (ViTModel or ViTForImageClassification, saved "
            "with save_pretrained)."
        )
    if head:
        logger.info(
            f"{name_or_path} was trained on other classes: a new classification head ({some_keys(head)}) is "
            "initialised; every other tensor comes from the checkpoint."
        )
    if pooler:
        logger.info(
            f"{name_or_path}: its pooler ({some_keys(pooler)}) is left out (ViTForImageClassification has none)."
        )


def count_parameters(model: torch.nn.Module) -> int:
    """Parameter count, also under ZeRO-3 where each rank holds a shard (`ds_numel` is the full size)."""
    return sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
