"""Model presets (published sizes, overrides, labels) and fine-tuning from a checkpoint with a new head. The same
fine-tuning under ZeRO-3 over 2 processes is in tests/launched/test_models_zero3.py."""

import pytest
import torch
from transformers import ViTForImageClassification

from hf_vit_scaling.arguments.parse import parse_args
from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.models.presets import (
    MODEL_PRESETS,
    build_model_from_preset,
    count_parameters,
    load_model_for_finetuning,
    preset_config,
)
from tests.helpers.builders import save_tiny_pretrained_vit

LABELS = [f"class_{i}" for i in range(7)]


def test_standard_presets_have_the_published_sizes():
    # Parameter counts of ViT-B/16, L/16, H/14 (Dosovitskiy et al. 2021, Table 1: 86 M, 307 M, 632 M).
    expected = {"vit-b-16": 86e6, "vit-l-16": 304e6, "vit-h-14": 632e6}
    for name, params in expected.items():
        config = preset_config(name, [str(i) for i in range(1000)])
        with torch.device("meta"):
            model = ViTForImageClassification(config)
        assert count_parameters(model) == pytest.approx(params, rel=0.02), name
    assert set(MODEL_PRESETS) >= {"vit-tiny-cpu", "vit-ti-16", "vit-s-16", "vit-b-16", "vit-l-16", "vit-h-14"}


def test_preset_overrides_and_labels():
    config = preset_config("vit-tiny-cpu", LABELS, image_size=48, patch_size=8)
    assert (config.image_size, config.patch_size, config.num_labels) == (48, 8, 7)
    assert config.id2label[3] == "class_3" and config.label2id["class_6"] == 6
    with pytest.raises(UserInputError, match="--patch_size 5 does not divide --image_size 48"):
        preset_config("vit-tiny-cpu", LABELS, image_size=48, patch_size=5)


def test_finetuning_keeps_backbone_and_builds_a_new_head(tmp_path):
    original = save_tiny_pretrained_vit(tmp_path / "ckpt")
    model = load_model_for_finetuning(str(tmp_path / "ckpt"), LABELS)
    assert model.classifier.weight.shape == (7, 32)
    assert model.config.id2label[6] == "class_6"
    for name, tensor in original.state_dict().items():
        if not name.startswith("classifier."):
            assert torch.equal(model.state_dict()[name], tensor), name
    std = model.classifier.weight.std().item()
    assert 0.0 < std < 0.1  # initialised (initializer_range 0.02), not garbage or zeros


@pytest.mark.parametrize(
    "labels, kept",
    [(["LABEL_0", "LABEL_1", "LABEL_2"], True), (["LABEL_0", "LABEL_2", "LABEL_1"], False),
     (["LABEL_0", "LABEL_1", "other"], False)],
    ids=["same", "reordered", "renamed"],
)  # fmt: skip
def test_a_checkpoint_of_the_same_classes_keeps_its_head(tmp_path, labels, kept):
    """Same classes in the same order: the head still fits and is kept (continued training). Any other label map:
    the classes' ids mean something else, so the head is new even though its shape matches."""
    original = save_tiny_pretrained_vit(tmp_path / "ckpt")  # 3 classes, transformers' default names LABEL_i
    model = load_model_for_finetuning(str(tmp_path / "ckpt"), labels)
    assert torch.equal(model.classifier.weight, original.classifier.weight) is kept
    assert torch.equal(model.vit.layernorm.weight, original.vit.layernorm.weight)  # the backbone either way


@pytest.mark.parametrize("source", ["preset", "checkpoint"])
def test_a_compiled_model_is_not_compiled_again_after_its_first_loss(tmp_path, source):
    """The recipe's models say they are single-label classifiers. Left unset, `config.problem_type` is written by the
    first forward's loss (transformers' ForSequenceClassificationLoss), which fails the guard dynamo put on it: the
    whole model was compiled a second time at step 2 of every --torch_compile run (seen in the recipe's log with
    TORCH_LOGS=recompiles: 'Recompiling ... 7/0: self.config.problem_type is None')."""
    from torch._dynamo.testing import CompileCounter

    if source == "preset":
        model = build_model_from_preset(preset_config("vit-tiny-cpu", LABELS, image_size=16))
    else:
        save_tiny_pretrained_vit(tmp_path / "ckpt")  # saved without a problem type, as transformers saves it
        model = load_model_for_finetuning(str(tmp_path / "ckpt"), LABELS)
    assert model.config.problem_type == "single_label_classification"
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(model.train(), backend=counter)
    pixels, labels = torch.randn(2, 3, 16, 16), torch.tensor([0, 6])
    compiled(pixel_values=pixels, labels=labels).loss.backward()
    frames = counter.frame_count
    compiled(pixel_values=pixels, labels=labels).loss.backward()
    torch._dynamo.reset()
    assert frames >= 1 and counter.frame_count == frames  # no frame compiled again


def test_folder_without_config_is_rejected(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserInputError, match="no config.json"):
        load_model_for_finetuning(str(tmp_path / "empty"), LABELS)


def test_config_overrides_change_the_preset_with_typed_values():
    config = preset_config(
        "vit-tiny-cpu", ["a", "b"], 28, 4, config_overrides="num_hidden_layers=6,intermediate_size=384"
    )
    assert (config.num_hidden_layers, config.intermediate_size, config.hidden_size) == (6, 384, 96)
    assert count_parameters(ViTForImageClassification(config)) > count_parameters(
        ViTForImageClassification(preset_config("vit-tiny-cpu", ["a", "b"], 28, 4))
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--config_overrides", "hidden_sise=128"], "hidden_sise isn't in the original config"),
        (["--config_overrides", "hidden_size=100"], "heads do not divide"),
        (["--config_overrides", "num_hidden_layers=six"], "--config_overrides"),
        (["--config_overrides", "hidden_size=128", "--model_name_or_path", "x"], "only applies to --model_preset"),
    ],
)
def test_bad_config_overrides_are_refused_before_anything_loads(tmp_path, argv, message):
    with pytest.raises(UserInputError, match=message):
        parse_args(["--output_dir", str(tmp_path), *argv])


def test_cnn_preset_is_a_small_resnet_with_the_data_s_classes():
    from transformers import ResNetForImageClassification

    from hf_vit_scaling.models.presets import build_model_from_preset, is_cnn, preset_config

    config = preset_config("resnet-tiny-cpu", [str(i) for i in range(10)], image_size=16)
    model = build_model_from_preset(config)
    assert isinstance(model, ResNetForImageClassification) and is_cnn(config) and config.image_size == 16
    assert config.hidden_sizes == [32, 64, 128] and config.depths == [1, 1, 1] and config.layer_type == "basic"
    assert sum(p.numel() for p in model.parameters()) == 312_490  # 0.31 M parameters, with 3 input channels
    assert model.config.id2label[3] == "3"


def test_regnet_preset_keeps_a_28_px_image_at_14x14_after_its_stem():
    """regnety-small-cpu is transformers' RegNetY: a stride-2 stem without pooling (ResNet's stem divides by 4),
    then stages at widths 48/96/192 of depths 1/2/3."""
    from transformers import RegNetForImageClassification

    from hf_vit_scaling.models.presets import build_model_from_preset, is_cnn, preset_config

    config = preset_config("regnety-small-cpu", [str(i) for i in range(10)], image_size=28)
    model = build_model_from_preset(config)
    assert isinstance(model, RegNetForImageClassification) and is_cnn(config) and config.image_size == 28
    assert config.hidden_sizes == [48, 96, 192] and config.depths == [1, 2, 3] and config.layer_type == "y"
    stem = model.regnet.embedder(torch.zeros(1, 3, 28, 28))
    assert stem.shape[-2:] == (14, 14)
    assert sum(p.numel() for p in model.parameters()) == 444_094  # 0.44 M parameters, with 3 input channels
