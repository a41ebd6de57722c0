"""The model card (README.md) of a medical-imaging model: intended use, dataset, split method, duplicate count, test
metrics with bootstrap intervals at a validation-chosen threshold, limitations, and "not for clinical use".

The YAML metadata is built with huggingface_hub's `ModelCardData` and `EvalResult` (so `model-index` follows the
Hub's schema), and `validate_medical_card` checks a card offline: `ModelCard(content)` parses the metadata strictly
(a malformed `model-index` raises), then every required section and the metric intervals are checked. The Hub's own
`ModelCard.validate()` posts the card to the Hub's API, so it is not used here; it runs on `push_to_hub`.
"""

import os

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from hf_vit_scaling.medical.splits import SPLIT_NAMES
from hf_vit_scaling.models.flops import has_vit_formula

NOT_FOR_CLINICAL_USE = "Not for clinical use"
REQUIRED_SECTIONS = (
    "## Intended use",
    "## Dataset",
    "## Split method and data hygiene",
    "## Results",
    "## Limitations",
    "## How to use",
)
CARD_METRICS = (  # (key in the report, name on the card, Hub metric type)
    ("roc_auc", "AUROC", "roc_auc"),
    ("sensitivity", "Sensitivity", "recall"),
    ("specificity", "Specificity", "specificity"),
    ("balanced_accuracy", "Balanced accuracy", "balanced_accuracy"),
    ("accuracy", "Accuracy", "accuracy"),
    ("expected_calibration_error", "Expected calibration error (15 bins; lower is better)", "ece"),
)

BODY = """
# {model_name}

> **{not_for_clinical_use}.** A demonstration of a training recipe. It has not been validated clinically,
> is not a medical device, and must not inform any diagnosis or treatment.

An image classifier ({model_desc}) that classifies a brain MRI slice as showing a tumour (`{positive}`) or not,
trained with hf-vit-scaling `recipes/medical_brain_mri/` (Hugging Face Trainer + DeepSpeed).

## Intended use

- Intended: teaching and benchmarking ML engineering for medical imaging: data hygiene, grouped splits, threshold
  choice, calibrated metrics with confidence intervals, model cards.
- Out of scope: any clinical, screening or triage use; any population, scanner, sequence or body part other than the
  training images; decisions about people.

## Dataset

- Source: {source}.
- {images} images, classes {classes}. Mixed formats and sizes, resized to {image_size} px for the model.
- No licence for the images is stated in the package, and no official train/test split: this card's split is our
  own (below). Do not redistribute the images or this model without checking the original source's terms.

## Split method and data hygiene

- Split: {split_method}.
- Duplicates found before splitting: {exact_duplicate_images} exact duplicate image(s) (same pixels);
  {images_with_a_duplicate} images have an exact or near duplicate, in {groups_of_two_or_more} groups
  ({redundant_images} redundant copies); {distinct_groups} distinct groups in all; {groups_with_mixed_labels}
  group(s) hold both labels. No group, and so no duplicate, is in more than one split.
- Split file: `{split_file}` (path, label, split, group) reproduces the split exactly.

| split | {label_header} | total |
|---|{label_rule}---|
{balance_rows}

## Results

Held-out test split: {test_images} images in {test_groups} duplicate groups, never used for training or for any
choice. The decision threshold was chosen on the validation split ({rule}: threshold {threshold:.4f}; validation
sensitivity {validation_sensitivity:.3f}, specificity {validation_specificity:.3f}) and applied unchanged to test.
Intervals: {confidence:.0%} percentile bootstrap, {resamples} resamples of whole duplicate groups, stratified by label
(seed {seed}).

| metric | value | {confidence:.0%} CI |
|---|---|---|
{metric_rows}

Confusion matrix at the threshold (rows: true {negative}/{positive}; columns: predicted): {confusion}

![ROC curve](roc_curve.png) ![Reliability diagram](reliability_diagram.png)

## Limitations

- About {distinct_groups} distinct scans after grouping duplicates; the test split holds {test_groups} groups, so
  intervals are wide and small differences between models are noise.
- Single source, no patient ids: slices of one patient that are not near duplicates may still sit in different
  splits; no demographic, scanner or site information, so no subgroup analysis is possible.
- Trained at low resolution: small lesions may be invisible at {image_size} px.
- Probabilities are calibrated only as the reliability diagram shows; the threshold fits this validation split only.

## How to use

```python
from transformers import pipeline

classifier = pipeline("image-classification", model="{load_path}")
scores = {{r["label"]: r["score"] for r in classifier("slice.png", top_k=None)}}
tumour = scores["{positive}"] >= {threshold:.4f}  # the validation-chosen threshold, not 0.5
```
"""


def _fmt(value) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def card_metadata(results: dict, dataset_name: str, model_name: str, model_type: str = "vit") -> ModelCardData:
    """Hub metadata: tags, and `model-index` with every test metric (EvalResult keeps it in the Hub's schema)."""
    test = results["test"]
    eval_results = [
        EvalResult(
            task_type="image-classification",
            task_name="Brain tumour detection",
            dataset_type=dataset_name,
            dataset_name=dataset_name,
            dataset_split="test (grouped, ours)",
            metric_type=hub_type,
            metric_name=name,
            metric_value=round(test[key]["value"], 4),
        )
        for key, name, hub_type in CARD_METRICS
    ]
    return ModelCardData(
        library_name="transformers",
        pipeline_tag="image-classification",
        tags=[
            "vision",
            "image-classification",
            model_type,
            "medical",
            "mri",
            "not-for-clinical-use",
            "hf-vit-scaling",
        ],
        model_name=model_name,
        eval_results=eval_results,
    )


def render_medical_card(
    results: dict,
    hygiene: dict,
    model_name: str,
    model_desc: str,
    image_size: int,
    dataset_name: str = "br35h",
    load_path: str | None = None,
    model_type: str = "vit",
) -> str:
    """Markdown card from evaluate.py's results and prepare.py's hygiene summary (see their JSON files)."""
    test, chosen = results["test"], results["threshold_choice"]
    balance = hygiene["class_balance"]
    labels = list(next(iter(balance.values())))
    positive = results["positive_label"]
    negative = next((label for label in labels if label != positive), "negative")
    metric_rows = "\n".join(
        f"| {name} | {_fmt(test[key]['value'])} | {_fmt(test[key]['ci_low'])} - {_fmt(test[key]['ci_high'])} |"
        for key, name, _ in CARD_METRICS
    )
    fields = {
        "split_file": "split.csv",
        "groups_with_mixed_labels": 0,
        **hygiene,  # source, images, split_method and the duplicate counts of hf_vit_scaling.medical.duplicates
        **chosen,  # threshold, rule, validation_sensitivity, validation_specificity
        **test["bootstrap"],  # confidence, resamples, seed
        "model_name": model_name,
        "model_desc": model_desc,
        "image_size": image_size,
        "not_for_clinical_use": NOT_FOR_CLINICAL_USE,
        "positive": positive,
        "negative": negative,
        "classes": ", ".join(labels),
        "label_header": " | ".join(labels),
        "label_rule": "---|" * len(labels),
        "balance_rows": "\n".join(
            f"| {split} | " + " | ".join(str(c) for c in counts.values()) + f" | {sum(counts.values())} |"
            for split, counts in sorted(balance.items(), key=lambda item: SPLIT_NAMES.index(item[0]))
        ),
        "test_images": results["test_images"],
        "test_groups": results["test_groups"],
        "metric_rows": metric_rows,
        "confusion": test["confusion_matrix"],
        "load_path": load_path or model_name,
    }
    body = BODY.format(**fields)
    return f"---\n{card_metadata(results, dataset_name, model_name, model_type).to_yaml()}\n---\n{body}"


def validate_medical_card(content: str) -> ModelCard:
    """Parse the card as the Hub's schema does (offline) and check the medical fields; raises ValueError naming what
    is missing."""
    card = ModelCard(content)  # strict: a malformed model-index raises here
    data = card.data.to_dict()
    problems = [f"metadata {key!r}" for key in ("pipeline_tag", "model-index") if key not in data]
    problems += [f"section {s!r}" for s in REQUIRED_SECTIONS if s not in card.text]
    if NOT_FOR_CLINICAL_USE not in card.text:
        problems.append(f"the words {NOT_FOR_CLINICAL_USE!r}")
    if "% CI" not in card.text:
        problems.append("metric confidence intervals")
    if problems:
        raise ValueError("medical model card lacks " + ", ".join(problems))
    return card


def describe_architecture(config, parameters: int) -> str:
    """The card's model line: "ViT, 4 layers, width 96, patch 16, 0.53 M parameters" (DeiT with a distillation
    token: "DeiT, ..."), or for anything else its model type, with a CNN's stage widths: "resnet, widths
    32/64/128, 0.31 M parameters"."""
    size = f"{parameters / 1e6:.2f} M parameters"
    if has_vit_formula(config):
        kind = "DeiT" if config.model_type == "deit" else "ViT"
        return (
            f"{kind}, {config.num_hidden_layers} layers, width {config.hidden_size}, patch {config.patch_size}, {size}"
        )
    widths = getattr(config, "hidden_sizes", None)
    stages = f"widths {'/'.join(map(str, widths))}, " if widths else ""
    return f"{config.model_type}, {stages}{size}"


def write_medical_card(
    output_dir: str,
    results: dict,
    hygiene: dict,
    model_desc: str,
    image_size: int,
    model_name: str | None = None,
    load_path: str | None = None,
    model_type: str = "vit",
) -> str:
    """Render, validate and write output_dir/README.md; returns the card's text."""
    name = model_name or os.path.basename(os.path.normpath(output_dir))
    content = render_medical_card(
        results, hygiene, name, model_desc, image_size, load_path=load_path, model_type=model_type
    )
    validate_medical_card(content)
    with open(os.path.join(output_dir, "README.md"), "w", encoding="utf-8") as f:
        f.write(content)
    return content
