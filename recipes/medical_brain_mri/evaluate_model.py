#!/usr/bin/env python
"""Evaluate a trained brain-MRI model the way a clinical reader needs it, and write its medical model card:

    python recipes/medical_brain_mri/evaluate_model.py --model_dir outputs/vit-tiny-br35h --data_dir outputs/br35h

1. Predicts the validation and test image folders that prepare.py wrote (the saved image processor, one process).
2. Picks the decision threshold on validation (Youden's J, or --min_sensitivity) and never looks at test for it.
3. Reports test AUROC, sensitivity, specificity, balanced accuracy, accuracy and ECE at that threshold, each with a
   bootstrap 95% interval that resamples whole duplicate groups (split.csv), plus the confusion matrix.
4. Writes into --model_dir: medical_results.json, roc_curve.png, reliability_diagram.png, and README.md (the card).
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
from transformers import AutoImageProcessor, AutoModelForImageClassification

from hf_vit_scaling.arguments.field_checks import require_in_range
from hf_vit_scaling.arguments.parser import ScriptParser
from hf_vit_scaling.data.decoding import decode_image
from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.evaluation.classification_metrics import roc_auc, sensitivity_specificity, softmax
from hf_vit_scaling.evaluation.model_card import load_card_facts, training_summary
from hf_vit_scaling.medical.card import describe_architecture, write_medical_card
from hf_vit_scaling.medical.plots import pyplot, save_reliability_diagram, save_roc_curve
from hf_vit_scaling.medical.splits import read_split_file, split_folder_path
from hf_vit_scaling.medical.statistics import BINARY_REPORT_METRICS, binary_report, choose_threshold
from hf_vit_scaling.models.presets import count_parameters
from hf_vit_scaling.models.weights import from_pretrained_strictly
from hf_vit_scaling.utils import write_json_atomically

POSITIVE_LABEL = "yes"  # Br35H: tumour


def parse_args(argv=None) -> argparse.Namespace:
    parser = ScriptParser("recipes/medical_brain_mri/evaluate_model.py", __doc__)
    parser.add_argument("--model_dir", required=True, help="The recipe's --output_dir (model + image processor).")
    parser.add_argument("--data_dir", default="outputs/br35h", help="prepare.py's --output_dir.")
    parser.add_argument("--positive_label", default=POSITIVE_LABEL, help="The class that counts as positive.")
    parser.add_argument(
        "--min_sensitivity",
        type=float,
        default=None,
        help="Pick the most specific threshold reaching this validation sensitivity instead of "
        "Youden's J (e.g. 0.95 for a screening use).",
    )
    parser.add_argument("--bootstrap_resamples", type=int, default=2000, help="Bootstrap resamples per metric.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the bootstrap.")
    parser.add_argument("--batch_size", type=int, default=64)
    args = parser.parse_args(argv)
    require_in_range(
        vars(args),
        {
            "bootstrap_resamples": (1, None, False, 2000),
            "seed": (0, None, False, 0),
            "batch_size": (1, None, False, 64),
        },
    )
    if args.min_sensitivity is not None and not 0 < args.min_sensitivity <= 1:
        raise UserInputError(
            f"--min_sensitivity must be in (0, 1], got {args.min_sensitivity}. Fix: e.g. --min_sensitivity 0.95."
        )
    return args


def load_model(model_dir: str):
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise UserInputError(
            f"--model_dir {model_dir!r} holds no trained model (config.json). Fix: train first "
            "(recipes/medical_brain_mri/run.sh) or point it at the recipe's --output_dir."
        )
    fix = "point --model_dir at the recipe's --output_dir of a finished run (its model.safetensors is whole)."
    model = from_pretrained_strictly(AutoModelForImageClassification, model_dir, UserInputError, "--model_dir", fix)
    model.eval()
    return model, AutoImageProcessor.from_pretrained(model_dir)


def predict(model, processor, paths: list[str], batch_size: int) -> np.ndarray:
    """(N, K) class probabilities."""
    logits = []
    with torch.no_grad():
        for start in range(0, len(paths), batch_size):
            images = [decode_image(p).convert("RGB") for p in paths[start : start + batch_size]]
            inputs = processor(images=images, return_tensors="pt")
            logits.append(model(pixel_values=inputs["pixel_values"]).logits.float().numpy())
    return softmax(np.concatenate(logits))


def split_items(
    data_dir: str, split: str, label2id: dict, positive: str, resize: int | None
) -> tuple[list[str], np.ndarray, list[str]]:
    """(image paths in the split folder, 1 for the positive label else 0, duplicate group) from split.csv."""
    records = [r for r in read_split_file(os.path.join(data_dir, "split.csv")) if r.split == split]
    if not records:
        raise UserInputError(f"split.csv in {data_dir!r} has no {split} images. Fix: rerun prepare.py.")
    unknown = {r.label for r in records} - set(label2id)
    if unknown or positive not in label2id:
        raise UserInputError(
            f"labels {sorted(unknown | ({positive} - set(label2id)))} are not the model's "
            f"({sorted(label2id)}). Fix: evaluate the model trained on this data, or pass "
            "--positive_label."
        )
    paths = [split_folder_path(data_dir, r, resize) for r in records]
    labels = np.array([int(r.label == positive) for r in records])
    return paths, labels, [r.group for r in records]


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
        pyplot()  # before predicting: a missing matplotlib fails now, not after minutes of work
        model, processor = load_model(args.model_dir)
        label2id = {str(k): int(v) for k, v in model.config.label2id.items()}
        positive = label2id.get(args.positive_label)
        hygiene_path = os.path.join(args.data_dir, "hygiene.json")
        if not os.path.isfile(hygiene_path):
            raise UserInputError(
                f"--data_dir {args.data_dir!r} has no hygiene.json. Fix: run recipes/medical_brain_mri/prepare.py "
                "--output_dir on it first (or point --data_dir at prepare.py's --output_dir)."
            )
        with open(hygiene_path, encoding="utf-8") as f:
            hygiene = json.load(f)
        started = time.time()
        torch.set_num_threads(max(1, os.cpu_count() or 1))
        val_paths, val_labels, _ = split_items(
            args.data_dir, "validation", label2id, args.positive_label, hygiene.get("resize")
        )
        test_paths, test_labels, test_groups = split_items(
            args.data_dir, "test", label2id, args.positive_label, hygiene.get("resize")
        )
        # Binary view: column 1 = the positive class's probability.
        order = [1 - positive, positive] if len(label2id) == 2 else None
        if order is None:
            raise UserInputError(
                f"the model has {len(label2id)} classes; this evaluation is binary. Fix: train on two classes."
            )
        val_probs = predict(model, processor, val_paths, args.batch_size)[:, order]
        test_probs = predict(model, processor, test_paths, args.batch_size)[:, order]
        rule = "youden" if args.min_sensitivity is None else "sensitivity"
        chosen = choose_threshold(val_labels, val_probs[:, 1], rule, args.min_sensitivity or 0.95)
        report = binary_report(
            test_labels,
            test_probs,
            chosen["threshold"],
            groups=test_groups,
            n_resamples=args.bootstrap_resamples,
            seed=args.seed,
        )
    except UserInputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    results = {
        "positive_label": args.positive_label,
        "threshold_choice": chosen,
        "test": report,
        "test_at_argmax": sensitivity_specificity(test_labels, test_probs[:, 1], 0.5),  # the default decision
        "validation_roc_auc": roc_auc(val_labels, val_probs[:, 1]),
        "test_images": len(test_labels),
        "test_groups": len(set(test_groups)),
        "validation_images": len(val_labels),
        "prediction_seconds": round(time.time() - started, 1),
    }
    write_json_atomically(os.path.join(args.model_dir, "medical_results.json"), results)
    save_roc_curve(
        os.path.join(args.model_dir, "roc_curve.png"),
        test_labels,
        test_probs[:, 1],
        chosen["threshold"],
        title="Br35H test ROC (threshold from validation)",
    )
    save_reliability_diagram(
        os.path.join(args.model_dir, "reliability_diagram.png"), test_labels, test_probs, title="Br35H test"
    )
    # What the model is (ViT, DeiT or CNN) and how the recipe trained it (from scratch, fine-tuned from an MAE run,
    # distilled from a teacher): its model_card.json, written beside the card this one replaces.
    params = count_parameters(model)
    model_desc = f"{describe_architecture(model.config, params)}; {training_summary(load_card_facts(args.model_dir))}"
    write_medical_card(
        args.model_dir, results, hygiene, model_desc, model.config.image_size, model_type=model.config.model_type
    )
    m = report
    print(
        f"Test ({len(test_labels)} images, {len(set(test_groups))} groups; threshold {chosen['threshold']:.4f} "
        f"from validation, {chosen['rule']}):"
    )
    for name in BINARY_REPORT_METRICS:
        print(f"  {name:27s} {m[name]['value']:.4f}  (95% CI {m[name]['ci_low']:.4f}-{m[name]['ci_high']:.4f})")
    print(f"  confusion matrix (rows true no/yes, columns predicted): {m['confusion_matrix']}")
    argmax = results["test_at_argmax"]
    print(
        f"  at the default decision (argmax, threshold 0.5): sensitivity {argmax['sensitivity']:.4f}, "
        f"specificity {argmax['specificity']:.4f}"
    )
    print(
        f"Wrote {args.model_dir}/medical_results.json, roc_curve.png, reliability_diagram.png, README.md", flush=True
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
