import textwrap

import pytest
import torch
from helpers import launcher_cmd, run
from transformers import ViTConfig, ViTForImageClassification

from hf_vit_scaling import MODEL_PRESETS, UserInputError, count_parameters, load_model_for_finetuning, preset_config

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


def _save_pretrained_vit(path, num_labels=3):
    torch.manual_seed(0)
    config = ViTConfig(image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=64, num_labels=num_labels)
    model = ViTForImageClassification(config)
    model.save_pretrained(path)
    return model


def test_finetuning_keeps_backbone_and_builds_a_new_head(tmp_path):
    original = _save_pretrained_vit(tmp_path / "ckpt")
    model = load_model_for_finetuning(str(tmp_path / "ckpt"), LABELS)
    assert model.classifier.weight.shape == (7, 32)
    assert model.config.id2label[6] == "class_6"
    for name, tensor in original.state_dict().items():
        if not name.startswith("classifier."):
            assert torch.equal(model.state_dict()[name], tensor), name
    std = model.classifier.weight.std().item()
    assert 0.0 < std < 0.1  # initialised (initializer_range 0.02), not garbage or zeros


def test_folder_without_config_is_rejected(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserInputError, match="no config.json"):
        load_model_for_finetuning(str(tmp_path / "empty"), LABELS)


@pytest.mark.distributed
def test_finetuning_under_zero3_two_processes(tmp_path):
    """transformers issue 17336: under ZeRO-3 a mismatched head must still be initialised, the backbone loaded."""
    original = _save_pretrained_vit(tmp_path / "ckpt")
    torch.save(original.state_dict(), tmp_path / "reference.pt")
    script = tmp_path / "check.py"
    script.write_text(textwrap.dedent(f"""
        import deepspeed, torch
        from transformers import TrainingArguments
        from hf_vit_scaling import load_model_for_finetuning
        args = TrainingArguments(output_dir={str(tmp_path / 'out')!r}, use_cpu=True, report_to="none",
                                 deepspeed={{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {{"stage": 3}}}})
        model = load_model_for_finetuning({str(tmp_path / 'ckpt')!r}, {LABELS!r})
        assert hasattr(model.classifier.weight, "ds_id"), "model was not partitioned by ZeRO-3"
        reference = torch.load({str(tmp_path / 'reference.pt')!r})
        params = dict(model.named_parameters())
        with deepspeed.zero.GatheredParameters(list(params.values())):
            for name, p in params.items():
                if name.startswith("classifier."):
                    continue
                assert torch.equal(p.data, reference[name]), name
            w = params["classifier.weight"].data
            assert tuple(w.shape) == (7, 32), w.shape
            assert torch.isfinite(w).all() and 0.0 < w.std().item() < 0.1, w.std().item()
            assert torch.equal(params["classifier.bias"].data, torch.zeros(7))
        print("ZERO3-OK", torch.distributed.get_rank())
    """))
    proc = run([*launcher_cmd("torchrun", 2), script], timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.count("ZERO3-OK") == 2
