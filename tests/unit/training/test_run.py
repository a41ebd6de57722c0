"""The recipe's building blocks that run before any process group exists: the model and the card's facts."""

import json
from types import SimpleNamespace

from hf_vit_scaling.arguments.parse import parse_args
from hf_vit_scaling.evaluation.card_facts import model_card_facts, teacher_card_rows
from hf_vit_scaling.models.build import build_model
from hf_vit_scaling.models.presets import image_processor_for
from hf_vit_scaling.parallel.engine import Engine
from hf_vit_scaling.training.run import report_skips
from tests.helpers.builders import save_tiny_pretrained_vit


def test_build_from_preset_and_from_a_checkpoint(tmp_path):
    args = parse_args(["--output_dir", str(tmp_path / "out"), "--image_size", "16"])
    model, processor, desc = build_model(args.model, ["a", "b"])
    assert desc == "vit-tiny-cpu trained from scratch" and model.config.num_labels == 2
    assert processor.size == {"height": 16, "width": 16}
    checkpoint = save_tiny_pretrained_vit(tmp_path / "ckpt", num_labels=3)
    image_processor_for(checkpoint.config).save_pretrained(tmp_path / "ckpt")
    args = parse_args(["--output_dir", str(tmp_path / "out"), "--model_name_or_path", str(tmp_path / "ckpt")])
    model, _, desc = build_model(args.model, ["x", "y", "z", "w"])
    assert desc == f"fine-tuned from {tmp_path / 'ckpt'}" and model.config.num_labels == 4


def test_distillation_token_builds_a_deit_that_reloads_as_one(tmp_path):
    import torch
    from transformers import AutoModelForImageClassification, DeiTForImageClassificationWithTeacher

    args = parse_args(["--output_dir", str(tmp_path / "out"), "--image_size", "16"])
    model, processor, desc = build_model(args.model, ["a", "b"], distillation_token=True)
    assert isinstance(model, DeiTForImageClassificationWithTeacher)
    assert desc == "vit-tiny-cpu with a distillation token (DeiT) trained from scratch"
    assert (model.config.hidden_size, model.config.num_hidden_layers, model.config.patch_size) == (96, 4, 4)
    embeddings = model.deit.embeddings  # DeiT's tokens start from N(0, 0.02), not from zero (presets._from_config)
    assert embeddings.cls_token.std() > 0.01 and not torch.equal(embeddings.cls_token, embeddings.distillation_token)
    model.save_pretrained(tmp_path / "deit")
    again = AutoModelForImageClassification.from_pretrained(tmp_path / "deit")
    assert isinstance(again, DeiTForImageClassificationWithTeacher)
    outputs = again.eval()(pixel_values=torch.randn(2, 3, 16, 16))
    assert torch.allclose(outputs.logits, (outputs.cls_logits + outputs.distillation_logits) / 2)


def test_card_facts_describe_the_run(tmp_path):
    args = parse_args(["--output_dir", str(tmp_path / "run-a"), "--gradient_accumulation_steps", "2",
                       "--per_device_train_batch_size", "16", "--max_steps", "7"])  # fmt: skip
    model, _, desc = build_model(args.model, ["a", "b"])
    selection = {"source": "sklearn-digits", "rows": 20, "of": 1797, "seed": 42}
    data = SimpleNamespace(source="sklearn-digits", splits={"validation": [0] * 5}, label_names=["a", "b"],
                           train_selection=selection)  # fmt: skip
    facts = model_card_facts(args.training, args.model, Engine("trainer"), {"rule": "none"}, 1, data, model, desc)
    assert facts["model_name"] == "run-a" and facts["eval_split_size"] == 5 and facts["dataset"] == "sklearn-digits"
    assert facts["train_selection"] == selection  # what a student checks its teacher's rows against
    assert facts["model_type"] == "vit"  # the card's architecture tag
    setup = facts["setup"]
    assert setup["global batch"] == 16 * 2 * 1 and setup["ds_config"] == "none"
    assert setup["engine"] == "none (plain Trainer)"
    assert setup["epochs"] == "7 steps" and setup["lr scaling"] == "none" and setup["model"] == "vit-tiny-cpu"


class _SkipsTrainer:
    """What `report_skips` reads of a VitTrainer: the gathered bad-image notes, skipped steps, saved metrics."""

    def __init__(self, output_dir, bad):
        self.args = SimpleNamespace(output_dir=str(output_dir))
        self.bad, self.skipped_steps, self.saved = bad, [], {}

    def gather_bad_samples(self):
        return self.bad

    def is_world_process_zero(self):
        return True

    def save_metrics(self, split, metrics):
        self.saved[split] = metrics


def test_a_bad_image_met_at_every_evaluation_or_epoch_counts_once(tmp_path):
    # The trainer notes a bad image each time a batch leaves it out: a corrupt validation file at each of two
    # evaluations, a corrupt training file in each of two epochs. Two distinct files, one per split.
    bad_val = {"split": "eval", "sample": "'val/0/bad.jpg'", "reason": "UnidentifiedImageError: x"}
    bad_train = {"split": "train", "sample": "row 7", "reason": "OSError: truncated"}
    trainer = _SkipsTrainer(tmp_path, [bad_val, bad_train, dict(bad_val), dict(bad_train)])
    assert report_skips(trainer) == {"bad images skipped": 2, "non-finite steps skipped": 0}
    assert trainer.saved["reliability"]["eval_skipped_images"] == 1
    assert trainer.saved["reliability"]["train_skipped_images"] == 1
    written = json.loads((tmp_path / "skipped_images.json").read_text())
    assert written["count"] == 2 and [b["sample"] for b in written["images"]] == ["'val/0/bad.jpg'", "row 7"]
    assert [b["times_skipped"] for b in written["images"]] == [2, 2]


def test_card_names_the_teacher_and_its_recorded_accuracy(tmp_path):
    distil = SimpleNamespace(teacher_model=str(tmp_path), distillation_type="hard", distillation_alpha=0.5,
                             distillation_tau=3.0)  # fmt: skip
    rows = teacher_card_rows(distil)
    assert rows["teacher"] == f"{tmp_path} (hard, alpha 0.5, tau 3)"
    assert rows["teacher accuracy"].startswith("not recorded")
    (tmp_path / "eval_results.json").write_text(json.dumps({"eval_accuracy": 0.75, "eval_samples": 8}))
    assert teacher_card_rows(distil)["teacher accuracy"] == "0.7500 on 8 images (its eval_results.json)"
