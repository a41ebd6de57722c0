"""Plots of the medical evaluation: the ROC curve with the chosen threshold, and the reliability diagram."""

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.evaluation import classification_metrics as cm


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display), or a clear error when it is not installed."""
    try:
        import matplotlib
    except ImportError as err:
        raise UserInputError(
            "the ROC and reliability plots need matplotlib. Fix: pip install 'hf-vit-scaling[plots]' (or matplotlib)."
        ) from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_roc_curve(path: str, references, scores, threshold: float | None = None, title: str = "ROC curve") -> str:
    """The ROC curve with its AUROC, the chance diagonal and the operating point at `threshold`, as a PNG."""
    plt = pyplot()
    fpr, tpr, _ = cm.roc_points(references, scores)
    fig, ax = plt.subplots(figsize=(4.5, 4.5), dpi=120)
    ax.plot(fpr, tpr, lw=2, label=f"AUROC {cm.roc_auc(references, scores):.3f}")
    ax.plot([0, 1], [0, 1], ls="--", color="grey", lw=1, label="chance")
    if threshold is not None:
        point = cm.sensitivity_specificity(references, scores, threshold)
        ax.plot(
            1 - point["specificity"],
            point["sensitivity"],
            "o",
            color="C3",
            label=f"threshold {threshold:.3f}: sens {point['sensitivity']:.3f}, spec {point['specificity']:.3f}",
        )
    ax.set(
        xlabel="1 - specificity (false positive rate)",
        ylabel="sensitivity (true positive rate)",
        title=title,
        xlim=(0, 1),
        ylim=(0, 1.01),
    )
    ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def save_reliability_diagram(
    path: str, references, probabilities, n_bins: int = 15, title: str = "Reliability diagram"
) -> str:
    """Accuracy against mean confidence per confidence bin (Guo et al. 2017, fig. 1), with the ECE and the share of
    images per bin, as a PNG. A calibrated model's bars meet the diagonal."""
    plt = pyplot()
    bins = cm.calibration_bins(references, probabilities, n_bins)
    ece = cm.expected_calibration_error(references, probabilities, n_bins)
    edges, width = bins["edges"], 1.0 / n_bins
    filled = bins["count"] > 0
    fig, (ax, hist) = plt.subplots(
        2, 1, figsize=(4.5, 5.5), dpi=120, sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    ax.bar(
        edges[:-1][filled], bins["accuracy"][filled], width=width, align="edge", edgecolor="black", label="accuracy"
    )
    ax.bar(
        edges[:-1][filled],
        (bins["confidence"] - bins["accuracy"])[filled],
        bottom=bins["accuracy"][filled],
        width=width,
        align="edge",
        color="C3",
        alpha=0.35,
        label="gap to confidence",
    )
    ax.plot([0, 1], [0, 1], ls="--", color="grey", lw=1)
    ax.set(ylabel="accuracy", title=f"{title} (ECE {ece:.3f}, {n_bins} bins)", xlim=(0, 1), ylim=(0, 1))
    ax.legend(loc="upper left", fontsize=7)
    hist.bar(edges[:-1], bins["count"] / bins["count"].sum(), width=width, align="edge", edgecolor="black")
    hist.set(xlabel="confidence (largest class probability)", ylabel="share")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
