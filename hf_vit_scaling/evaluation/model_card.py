"""The model card (README.md) written beside the trained model: results, training setup and, when the run wrote its
throughput report (`throughput.json`), the training speed measured on this hardware."""

import json
import os

from hf_vit_scaling.throughput.report import format_value
from hf_vit_scaling.throughput.schema import REPORT_FILENAME, load_throughput_report

CARD_TEMPLATE = """---
library_name: transformers
pipeline_tag: image-classification
tags:
- vision
- image-classification
- {model_type}
- deepspeed
- hf-vit-scaling
{datasets_yaml}---

# {model_name}

{model_noun} ({model_desc}) trained for image classification on **{dataset}** with
hf-vit-scaling `recipes/train_vit.py` (Hugging Face Trainer{ds_desc}).

## Results (held-out split: {eval_split_size} images)

| metric | value |
|---|---|
{metrics_rows}

## Training setup

| setting | value |
|---|---|
{setup_rows}
{speed_section}
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


PEAK_SOURCES = {
    "user": "given with --peak_tflops",
    "table": "the device's dense peak for this precision (vendor table)",
    "matmul-probe": "a large matmul timed on this device at the start of the run",
    "none": "unknown",
}


def speed_rows(report: dict) -> dict:
    """The card's "Training speed" rows from a throughput report (`throughput.json`, schema in
    `throughput.schema`): warm-up steps excluded, images/s of the slowest rank's measured time. A run with no step
    after its warm-up measured nothing: the rows say n/a."""
    setup, speed, flops, memory = report["setup"], report["throughput"], report["flops"], report["memory"]
    peak, source = flops["peak_tflops_per_device"], PEAK_SOURCES.get(flops["peak_source"], flops["peak_source"])
    kind = "allocated" if memory["kind"] == "allocated_peak_bytes" else "resident (RSS)"
    gib = None if memory["max_bytes"] is None else memory["max_bytes"] / 2**30
    versions = ", ".join(f"{name} {version}" for name, version in (setup["versions"] or {}).items() if version)
    return {
        "images/s (all devices)": format_value(speed["images_per_s"], ".1f"),
        "images/s per device": format_value(speed["images_per_s_per_device"], ".1f"),
        "MFU": format_value(flops["mfu"], ".1%"),
        "MFU peak": "n/a" if peak is None else f"{peak:.3g} TFLOP/s per device, {source}",
        "peak memory per device": f"{format_value(gib, '.2f', ' GiB')} {kind}",
        "measured": f"{speed['steps_measured'] or 0} steps after {speed['warmup_steps']} warm-up steps",
        "hardware": f"{setup['world_size']} x {', '.join(setup['devices'] or ['?'])} on {setup['num_nodes']} node(s)",
        "versions": versions or "n/a",
    }


def speed_section(report: dict | None) -> str:
    if report is None:
        return ""
    return "\n## Training speed\n\n| measure | value |\n|---|---|\n" + _rows(speed_rows(report)) + "\n"


# What recipes/train_vit.py leaves beside a model it trained (`Trainer.save_metrics`): eval_results.json, and
# all_results.json with the train metrics merged in. Read in this order.
RESULT_FILES = ("eval_results.json", "all_results.json")
CARD_FACTS_FILENAME = "model_card.json"


def recorded_accuracy(folder: str) -> tuple[float, int | None, str] | None:
    """(eval_accuracy, eval_samples or None, the file it came from) that a model folder records, or None when no
    result file holds an accuracy (a folder saved by other code, or a run that never evaluated)."""
    for name in RESULT_FILES:
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                metrics = json.load(f)
        except (OSError, ValueError):
            continue
        accuracy = metrics.get("eval_accuracy") if isinstance(metrics, dict) else None
        if isinstance(accuracy, (int, float)) and not isinstance(accuracy, bool):
            samples = metrics.get("eval_samples")
            return float(accuracy), samples if isinstance(samples, int) else None, name
    return None


def teacher_accuracy(folder: str) -> str:
    """The teacher's accuracy as its own run recorded it, for the card and the log: "0.9062 on 64 images (its
    eval_results.json)", or "not recorded (...)". Its evaluation set is its own run's, not necessarily this one's."""
    recorded = recorded_accuracy(folder)
    if recorded is None:
        return f"not recorded (no eval_accuracy in {' or '.join(RESULT_FILES)} of {folder})"
    accuracy, samples, name = recorded
    on = f" on {samples} images" if samples else ""
    return f"{accuracy:.4f}{on} (its {name})"


def model_noun(model_type: str) -> str:
    """The card's first words: "A Vision Transformer" for ViT and DeiT, else the architecture by its transformers
    model type ("A resnet image classifier"): a CNN teacher's card must not call it a transformer."""
    return "A Vision Transformer" if model_type in ("vit", "deit") else f"A {model_type} image classifier"


def render_model_card(info: dict, throughput: dict | None = None) -> str:
    """Markdown card from the facts the recipe collected (keys: see `write_model_card`)."""
    metrics = {k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in info["metrics"].items()}
    dataset = info["dataset"]
    # A Hub id is "owner/name"; a folder on this machine (absolute or relative) is not one.
    is_hub_id = "/" in dataset and not os.path.isabs(dataset) and not os.path.exists(dataset)
    datasets_yaml = f"datasets:\n- {dataset}\n" if is_hub_id else ""
    ds_config = info["setup"].get("ds_config")
    ds_config = ds_config if isinstance(ds_config, str) and ds_config.endswith(".json") else None  # a config file
    model_type = info.get("model_type", "vit")  # facts written before the key existed were all ViTs
    return CARD_TEMPLATE.format(
        model_name=info["model_name"],
        model_type=model_type,
        model_noun=model_noun(model_type),
        model_desc=info["model_desc"],
        dataset=dataset,
        datasets_yaml=datasets_yaml,
        ds_desc=engine_desc(info["setup"], ds_config),
        eval_split_size=info["eval_split_size"],
        metrics_rows=_rows(metrics),
        setup_rows=_rows(info["setup"]),
        speed_section=speed_section(throughput),
        load_path=info.get("hub_model_id") or info["model_name"],
    )


def write_model_card(output_dir: str, info: dict) -> str:
    """README.md in `output_dir`, with the speed table when the run's throughput report is there, and its facts as
    model_card.json (`CARD_FACTS_FILENAME`), for tools that write another card later (the medical evaluation)."""
    report_path = os.path.join(output_dir, REPORT_FILENAME)
    throughput = load_throughput_report(report_path) if os.path.isfile(report_path) else None
    path = os.path.join(output_dir, "README.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_model_card(info, throughput))
    with open(os.path.join(output_dir, CARD_FACTS_FILENAME), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=2, default=str)
    return path


def load_card_facts(model_dir: str) -> dict | None:
    """The facts the recipe wrote beside its card (model_card.json), or None for a folder without them."""
    path = os.path.join(model_dir, CARD_FACTS_FILENAME)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def training_summary(facts: dict | None) -> str:
    """How the weights came to be, from the recipe's card facts: its model description (a preset trained from
    scratch, or the checkpoint fine-tuned from, named by its MAE pretraining when it was one), and the teacher."""
    if facts is None:
        return "training not recorded (no model_card.json beside the model)"
    setup = facts.get("setup", {})
    text = f"fine-tuned from {setup['pretraining']}" if setup.get("pretraining") else facts.get("model_desc", "?")
    if setup.get("teacher"):
        text += f", distilled from {setup['teacher']}, teacher accuracy {setup.get('teacher accuracy')}"
    return text
