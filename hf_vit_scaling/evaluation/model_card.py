"""The model card (README.md) written beside the trained model."""

import os

CARD_TEMPLATE = """---
library_name: transformers
pipeline_tag: image-classification
tags:
- vision
- image-classification
- vit
- deepspeed
- hf-vit-scaling
{datasets_yaml}---

# {model_name}

A Vision Transformer ({model_desc}) trained for image classification on **{dataset}** with
hf-vit-scaling `recipes/train_vit.py` (Hugging Face Trainer{ds_desc}).

## Results (held-out split: {eval_split_size} images)

| metric | value |
|---|---|
{metrics_rows}

## Training setup

| setting | value |
|---|---|
{setup_rows}

## Use

```python
from transformers import pipeline

classifier = pipeline("image-classification", model="{load_path}")
classifier("image.png")
```
"""


def _rows(values: dict) -> str:
    return "\n".join(f"| {key} | {value} |" for key, value in values.items())


def engine_desc(setup: dict, ds_config: str | None) -> str:
    """ " + DeepSpeed `zero2.json`", " + PyTorch FSDP2" or "" (the plain Trainer) for the card's first line."""
    if ds_config:
        return f" + DeepSpeed `{os.path.basename(ds_config)}`"
    return " + PyTorch FSDP2" if str(setup.get("engine", "")).startswith("FSDP2") else ""


def render_model_card(info: dict) -> str:
    """Markdown card from the facts the recipe collected (keys: see `write_model_card`)."""
    metrics = {k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in info["metrics"].items()}
    dataset = info["dataset"]
    # A Hub id is "owner/name"; a folder on this machine (absolute or relative) is not one.
    is_hub_id = "/" in dataset and not os.path.isabs(dataset) and not os.path.exists(dataset)
    datasets_yaml = f"datasets:\n- {dataset}\n" if is_hub_id else ""
    ds_config = info["setup"].get("ds_config")
    ds_config = ds_config if isinstance(ds_config, str) and ds_config.endswith(".json") else None  # a config file
    return CARD_TEMPLATE.format(
        model_name=info["model_name"],
        model_desc=info["model_desc"],
        dataset=dataset,
        datasets_yaml=datasets_yaml,
        ds_desc=engine_desc(info["setup"], ds_config),
        eval_split_size=info["eval_split_size"],
        metrics_rows=_rows(metrics),
        setup_rows=_rows(info["setup"]),
        load_path=info.get("hub_model_id") or info["model_name"],
    )


def write_model_card(output_dir: str, info: dict) -> str:
    path = os.path.join(output_dir, "README.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_model_card(info))
    return path
