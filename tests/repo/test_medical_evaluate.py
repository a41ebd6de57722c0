"""recipes/medical_brain_mri/evaluate_model.py on a small prepared dataset (prepare.py's output, no wheel): the
medical card describes any classifier the recipe trains, a CNN (no num_hidden_layers, no patches) as well as a ViT,
and says how it was trained, read from the recipe's model_card.json (from scratch, from an MAE run, from a teacher)."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from hf_vit_scaling.models.presets import build_model_from_preset, image_processor_for, preset_config
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


def test_a_model_short_of_a_tensor_is_refused_not_filled_at_random(tmp_path):
    from safetensors.torch import load_file, save_file

    from hf_vit_scaling.errors import UserInputError

    folder = saved_model(tmp_path / "model", "vit-tiny-cpu", None)
    tensors = load_file(folder / "model.safetensors")
    dropped = next(key for key in sorted(tensors) if "layer.1." in key)
    del tensors[dropped]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UserInputError, match=r"--model_dir .* does not hold every tensor of its model: 1 missing"):
        load_evaluate().load_model(str(folder))
