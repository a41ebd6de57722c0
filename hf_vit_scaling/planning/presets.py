"""The shapes of published large ViTs the planner knows besides `models.MODEL_PRESETS` (which the recipe trains):
recipes/plan.py's `--model_preset vit-g-14` and the like, for planning only. Each row names its source."""

# (image, patch, hidden, layers, heads, MLP width, MLP kind: "gelu" or "swiglu", `shapes.transformer_layer_sizes`)
_PLANNER_PRESET_ROWS = {
    # Zhai et al. 2022, "Scaling Vision Transformers" (arXiv 2106.04560): ViT-g/14 width 1408, depth 40,
    # MLP 6144, 16 heads (1,011 M); ViT-G/14 1664, 48, 8192, 16 (1,843 M). NVIDIA NeMo's ViT g/14 and G/14 (its
    # "Vision Transformer Training" page) and EVA01-CLIP-g/14's vision tower (mlp_ratio 4.3637 x 1408 = 6144) use
    # the same shapes.
    "vit-g-14": (224, 14, 1408, 40, 16, 6144, "gelu"),
    "vit-bigg-14": (224, 14, 1664, 48, 16, 8192, "gelu"),
    # ViT-e: Chen et al. 2022, "PaLI" (arXiv 2209.06794): width 1792, depth 56, MLP 15360, 16 heads (3.9 B).
    "vit-e-14": (224, 14, 1792, 56, 16, 15360, "gelu"),
    # EVA02-CLIP-E/14's vision tower (EVA-CLIP, Sun et al. 2023, arXiv 2303.15389; its model config): width 1792,
    # depth 64, 16 heads, mlp_ratio 8.571 x 1792 = 15360 (4.4 B).
    "eva02-e-14": (224, 14, 1792, 64, 16, 15360, "gelu"),
    # DINOv2 (Oquab et al. 2023, arXiv 2304.07193; facebookresearch/dinov2 MODEL_CARD.md and configs/train): ViT-g/14
    # "vit_giant2" 1536 wide, 40 deep, 24 heads, SwiGLU FFN; `SwiGLUFFNFused` makes the hidden width
    # (int(4 x 1536 x 2/3) + 7) // 8 x 8 = 4096. Its ViT-L/14 training config (vitl14.yaml) uses SwiGLU too:
    # (int(4096 x 2/3) + 7) // 8 x 8 = 2736.
    "dinov2-g-14": (224, 14, 1536, 40, 24, 4096, "swiglu"),
    "dinov2-l-14": (224, 14, 1024, 24, 16, 2736, "swiglu"),
    # InternViT-6B (Chen et al. 2023, "InternVL", arXiv 2312.14238; OpenGVLab/InternViT-6B-224px config.json):
    # hidden 3200, 48 layers, 25 heads, MLP 12800, patch 14 (5,903 M). Its QK-norm and bias-free QKV are not modelled
    # (+6,400 and -9,600 parameters a layer). The 448 px V1-5 drops the last 3 blocks: --num_hidden_layers is not a
    # flag, so it has its own row (45 layers, 5,540 M).
    "internvit-6b": (224, 14, 3200, 48, 25, 12800, "gelu"),
    "internvit-6b-448": (448, 14, 3200, 45, 25, 12800, "gelu"),
}
PLANNER_PRESETS: dict[str, dict] = {
    name: dict(zip(("image_size", "patch_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "intermediate_size", "mlp"), row))
    for name, row in _PLANNER_PRESET_ROWS.items()
}  # fmt: skip
