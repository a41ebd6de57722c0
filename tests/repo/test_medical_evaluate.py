"""recipes/medical_brain_mri/evaluate_model.py on a small prepared dataset (prepare.py's output, no wheel): the
medical card describes any classifier the recipe trains, a CNN (no num_hidden_layers, no patches) as well as a ViT,
and says how it was trained, read from the recipe's model_card.json (from scratch, from an MAE run, from a teacher)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from hf_vit_scaling.models.presets import build_model_from_preset, image_processor_for, preset_config
from tests.helpers.builders import alter_saved_weights
from tests.helpers.launchers import error_lines, run
from tests.repo.test_medical_prepare import load_prepare, saved_dataset

EVALUATE = Path(__file__).resolve().parents[2] / "recipes" / "medical_brain_mri" / "evaluate_model.py"
LABELS = ["healthy", "sick"]


def load_evaluate():
    spec = importlib.util.spec_from_file_location("medical_evaluate", EVALUATE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("medical")
    out = root / "prepared"
    argv = ["--dataset_name", saved_dataset(root / "saved"), "--group_column_name", "patient", "--output_dir",
            str(out), "--resize", "32"]  # fmt: skip
    assert load_prepare().main(argv) == 0
    return out


def saved_model(folder: Path, preset: str, facts: dict | None) -> Path:
    torch.manual_seed(0)
    config = preset_config(preset, LABELS, image_size=32, **({"patch_size": 8} if preset.startswith("vit") else {}))
    build_model_from_preset(config).save_pretrained(folder)
    image_processor_for(config).save_pretrained(folder)
    if facts is not None:  # what the recipe writes beside its own card (evaluation/model_card.write_model_card)
        (folder / "model_card.json").write_text(json.dumps(facts))
    return folder


@pytest.mark.parametrize(
    ("preset", "facts", "architecture", "training"),
    [
        ("resnet-tiny-cpu", {"model_desc": "resnet-tiny-cpu (CNN) trained from scratch", "setup": {}},
         "resnet, widths 32/64/128", "resnet-tiny-cpu (CNN) trained from scratch"),
        ("vit-tiny-cpu", {"model_desc": "fine-tuned from outputs/mae", "setup": {
            "pretraining": "MAE outputs/mae (vit-tiny-cpu, mask ratio 0.75)", "teacher": "outputs/cnn (hard)",
            "teacher accuracy": "0.9335 on 451 images (its eval_results.json)"}},
         "ViT, 4 layers, width 96, patch 8",
         "fine-tuned from MAE outputs/mae (vit-tiny-cpu, mask ratio 0.75), distilled from outputs/cnn (hard), "
         "teacher accuracy 0.9335 on 451 images (its eval_results.json)"),
    ],
    ids=["cnn-teacher", "mae-and-distilled-vit"],
)  # fmt: skip
def test_card_describes_the_classifier_and_how_it_was_trained(tmp_path, data_dir, preset, facts, architecture,
                                                              training, capsys):  # fmt: skip
    model_dir = saved_model(tmp_path / "model", preset, facts)
    argv = ["--model_dir", str(model_dir), "--data_dir", str(data_dir), "--positive_label", "sick",
            "--bootstrap_resamples", "20"]  # fmt: skip
    assert load_evaluate().main(argv) == 0
    results = json.loads((model_dir / "medical_results.json").read_text())
    assert 0.0 <= results["test"]["roc_auc"]["value"] <= 1.0
    card = (model_dir / "README.md").read_text()
    line = next(line for line in card.splitlines() if line.startswith("An image classifier ("))
    assert architecture in line and training in line
    assert "Trained from scratch" not in card


def test_a_model_without_the_recipes_facts_is_not_called_from_scratch():
    from hf_vit_scaling.evaluation.model_card import training_summary

    assert training_summary(None) == "training not recorded (no model_card.json beside the model)"
    assert training_summary({"model_desc": "vit-tiny-cpu trained from scratch", "setup": {}}) == (
        "vit-tiny-cpu trained from scratch"
    )


@pytest.mark.parametrize("alteration, words", [("missing", "1 missing"), ("unexpected", "1 unexpected"),
                                               ("wrong shape", "1 of another shape")])  # fmt: skip
def test_a_model_not_matching_its_weights_is_refused_by_the_script(tmp_path, data_dir, alteration, words):
    """The script as a process, on a tiny random-init ViT whose model.safetensors lost a tensor, gained one or holds
    one of another shape, with a real prepared data set (the one the card tests evaluate on, so only the weights can
    stop it): exit 2, one `error:` line naming --model_dir and the problem, no traceback, no results. Fails if the
    strict load lets the missing, unexpected or mismatched keys through (the model is evaluated: exit 0, no error
    line, medical_results.json written), or if transformers' RuntimeError ends the script in a traceback."""
    folder = saved_model(tmp_path / "model", "vit-tiny-cpu", None)
    alter_saved_weights(folder, alteration)
    proc = run([sys.executable, EVALUATE, "--model_dir", folder, "--data_dir", data_dir, "--positive_label", "sick",
                "--bootstrap_resamples", "20"], timeout=300)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = error_lines(proc.stderr)
    assert "--model_dir" in line and "does not hold every tensor of its model" in line and words in line, line
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert not (folder / "medical_results.json").exists()


def test_the_run_s_results_file_holds_its_metrics_times_config_and_provenance_and_renders_them(tmp_path, data_dir):
    """What run.sh does at its end with RESULTS set: benchmarks/recipe_results.py writes the evaluation's metrics,
    the step times and the config with provenance; the page's tables are rendered from that file, figure for figure
    (a renderer that read another key, or a writer that dropped one, fails here)."""
    sys.path.insert(0, str(EVALUATE.parents[2] / "benchmarks"))
    import table_renderers

    model_dir = saved_model(tmp_path / "model", "vit-tiny-cpu", None)
    argv = ["--model_dir", str(model_dir), "--data_dir", str(data_dir), "--positive_label", "sick",
            "--bootstrap_resamples", "20"]  # fmt: skip
    assert load_evaluate().main(argv) == 0
    config = tmp_path / "config.yaml"
    config.write_text("model_preset: vit-tiny-cpu\nnum_train_epochs: 30\n")
    out = tmp_path / "results.json"
    script = EVALUATE.parents[2] / "benchmarks" / "recipe_results.py"
    proc = run([sys.executable, str(script), "--run_command", "make medical", "--metrics",
                str(model_dir / "medical_results.json"), "--config", str(config), "--seconds", "prepare=26",
                "teacher=0", "train=335", "evaluate=14", "total=375", "--output", str(out)])  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    metrics = json.loads((model_dir / "medical_results.json").read_text())
    assert result["metrics"] == metrics
    assert result["config"] == {"model_preset": "vit-tiny-cpu", "num_train_epochs": 30}
    assert {"commit", "cpu", "cores", "versions", "date"} <= result["provenance"].keys()
    times = table_renderers.recipe_step_times(result)
    assert "| prepare | 26 s |" in times and "| total | 375 s (6 min 15 s) |" in times and "teacher" not in times
    rendered = table_renderers.medical_test_metrics(result)
    auroc = metrics["test"]["roc_auc"]
    assert f"| AUROC | **{auroc['value']:.3f}** | {auroc['ci_low']:.3f} - {auroc['ci_high']:.3f} |" in rendered
    assert f"{metrics['test_images']} images" in rendered
