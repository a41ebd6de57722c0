"""The renderers of a recipe folder's results file (benchmarks/recipe_results.py): its steps' times, top-1, MAE's two
steps and the medical recipe's test metrics."""

from .cells import strong, table

# The medical recipe's test metrics, as its page names them.
MEDICAL_METRICS = {
    "roc_auc": "AUROC",
    "sensitivity": "sensitivity",
    "specificity": "specificity",
    "balanced_accuracy": "balanced accuracy",
    "accuracy": "accuracy",
    "expected_calibration_error": "expected calibration error",
}


def minutes(seconds: float) -> str:
    """Seconds as the recipe pages write them: "649 s (10 min 49 s)"."""
    seconds = round(seconds)
    return f"{seconds} s ({seconds // 60} min {seconds % 60} s)"


def recipe_step_times(result: dict) -> str:
    """The recipe's command and the wall seconds of each of its steps (a step that did nothing, 0 s, left out)."""
    rows = [[name, f"{s} s"] for name, s in result["seconds"].items() if s and name != "total"]
    total = result["seconds"].get("total")
    if total is not None:
        rows.append(["total", minutes(total)])
    return f"`{result['run_command']}` (config `{result['config_file']}`):\n\n" + table(["step", "time"], rows)


def recipe_top1(result: dict) -> str:
    """A classification recipe's run: its command, epochs, top-1 on the evaluation split (bold), the EMA weights'
    top-1 where the run kept an EMA, the final training loss and the training time."""
    metrics, ema = result["metrics"], result["metrics"].get("eval_ema_accuracy")
    row = [
        f"`{result['run_command']}`",
        f"{metrics['epoch']:.0f}",
        strong(f"{metrics['eval_accuracy']:.4f}"),
        "n/a" if ema is None else f"{ema:.4f}",
        f"{metrics['train_loss']:.4f}",
        minutes(result["seconds"]["train"]),
    ]
    return table(["run", "epochs", "top-1", "EMA top-1", "train loss", "train time"], [row])


def mae_two_steps(result: dict) -> str:
    """recipes/mae/run.sh's two steps: the pretraining's reconstruction loss and k-NN accuracy (labels unused), the
    fine-tune's top-1 (bold) and EMA top-1, each step's final training loss and its wall time in the script."""
    metrics, seconds = result["metrics"], result["seconds"]
    pre, tune = metrics["pretraining"], metrics["fine-tuning"]
    top1, ema = strong(f"{tune['eval_accuracy']:.4f}"), tune.get("eval_ema_accuracy")
    rows = [
        [
            "pretraining (labels unused)",
            f"{pre['epoch']:.1f}",
            f"reconstruction loss {pre['eval_loss']:.3f}, k-NN accuracy {pre['eval_knn_accuracy']:.3f}",
            f"{pre['train_loss']:.4f}",
            minutes(seconds["pretraining"]),
        ],
        [
            "fine-tuning",
            f"{tune['epoch']:.0f}",
            f"top-1 {top1}" + ("" if ema is None else f" (EMA {ema:.4f})"),
            f"{tune['train_loss']:.4f}",
            minutes(seconds["fine-tuning"]),
        ],
    ]
    lead, total = f"`{result['run_command']}`:\n\n", f"\n\nBoth steps: {minutes(seconds['total'])}."
    return lead + table(["step", "epochs", "evaluation", "train loss", "time"], rows) + total


RULES = {"youden": "Youden's J"}


def medical_test_metrics(result: dict) -> str:
    """Test metrics at the threshold chosen on validation, each with its bootstrap interval (AUROC in bold: the
    figure the recipe's target is set on)."""
    metrics = result["metrics"]
    test, choice = metrics["test"], metrics["threshold_choice"]
    rule = RULES.get(choice["rule"], choice["rule"])
    lead = (
        f"Test split ({metrics['test_images']} images, {metrics['test_groups']} duplicate groups), threshold "
        f"{test['threshold']:.3f} chosen on validation by {rule}:\n\n"
    )
    rows = [
        [
            label,
            strong(f"{test[key]['value']:.3f}", key == "roc_auc"),
            f"{test[key]['ci_low']:.3f} - {test[key]['ci_high']:.3f}",
        ]
        for key, label in MEDICAL_METRICS.items()
    ]
    argmax = metrics["test_at_argmax"]
    tail = (
        f"\n\nConfusion matrix at that threshold (rows true no/yes): {test['confusion_matrix']}; at argmax, "
        f"sensitivity {argmax['sensitivity']:.3f}, specificity {argmax['specificity']:.3f}."
    )
    return lead + table(["metric", "value", "95% CI"], rows) + tail
