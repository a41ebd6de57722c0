"""Tests `arguments.distillation`: DeiT's defaults, and one error per bad input (flags without a teacher, a teacher
folder missing or unreadable, teacher classes other than the data's, flags the teacher cannot run with)."""

import pytest
from transformers import ResNetConfig

from hf_vit_scaling.arguments.parse import parse_args
from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.training.distillation import check_teacher_labels, check_teacher_rows


@pytest.fixture
def teacher(tmp_path) -> str:
    """A saved config of a tiny ResNet with 3 classes (the config is all the parse step reads)."""
    labels = ["cat", "dog", "fox"]
    config = ResNetConfig(
        num_labels=3, id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)}
    )
    config.save_pretrained(tmp_path / "teacher")
    return str(tmp_path / "teacher")


def parse(tmp_path, *flags):
    return parse_args(["--output_dir", str(tmp_path / "out"), *flags]).distillation


def test_defaults_are_deit_s(tmp_path, teacher):
    none = parse(tmp_path)
    assert none.distillation_type == "none" and not none.enabled
    soft = parse(tmp_path, "--teacher_model", teacher)
    assert (soft.distillation_type, soft.distillation_alpha, soft.distillation_tau) == ("soft", 0.1, 3.0)
    hard = parse(tmp_path, "--teacher_model", teacher, "--distillation_type", "hard")
    assert (hard.distillation_type, hard.distillation_alpha) == ("hard", 0.5)
    assert parse(tmp_path, "--distillation_type", "none").distillation_type == "none"  # harmless without a teacher


@pytest.mark.parametrize(
    "flags",
    [
        ["--distillation_type", "soft"],
        ["--distillation_alpha", "0.2"],
        ["--distillation_tau", "2"],
        ["--distillation_token"],
    ],
)
def test_distillation_flags_without_a_teacher_are_refused(tmp_path, flags):
    with pytest.raises(UserInputError, match=f"{flags[0]} without --teacher_model") as err:
        parse(tmp_path, *flags)
    assert "\n" not in str(err.value)


def test_missing_or_unreadable_teacher_folder_is_refused(tmp_path):
    with pytest.raises(UserInputError, match="--teacher_model .*nope.* does not exist"):
        parse(tmp_path, "--teacher_model", str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserInputError, match="--teacher_model .*empty.* could not be read") as err:
        parse(tmp_path, "--teacher_model", str(tmp_path / "empty"))
    assert "\n" not in str(err.value)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    with pytest.raises(UserInputError, match="--teacher_model .*broken.* could not be read"):
        parse(tmp_path, "--teacher_model", str(tmp_path / "broken"))


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--distillation_alpha", "1.5"], "--distillation_alpha must be in \\[0, 1\\]"),
        (["--distillation_tau", "0"], "--distillation_tau must be above 0"),
        (["--distillation_type", "none"], "--distillation_type none"),
        (["--distillation_token", "--model_name_or_path", "."], "--distillation_token builds a DeiT student"),
        (["--class_weighting", "balanced"], "--class_weighting cannot be combined with --teacher_model"),
        (["--distillation_token", "--drop_path_rate", "0.1"], "--drop_path_rate work\\(s\\) on a plain ViT"),
        (["--distillation_token", "--weight_init", "jax"], "--weight_init work\\(s\\) on a plain ViT"),
    ],
)
def test_bad_values_with_a_teacher_are_refused(tmp_path, teacher, flags, message):
    with pytest.raises(UserInputError, match=message) as err:
        parse(tmp_path, "--teacher_model", teacher, *flags)
    assert "\n" not in str(err.value)


def test_teacher_classes_must_be_the_data_s_and_both_lists_are_named():
    check_teacher_labels(["cat", "dog"], ["cat", "dog"], "t")
    with pytest.raises(UserInputError) as err:
        check_teacher_labels(["cat", "dog", "fox"], ["dog", "cat", "fox"], "t")
    message = str(err.value)
    assert "teacher ['cat', 'dog', 'fox']" in message and "data ['dog', 'cat', 'fox']" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--patch_size", "4"], "--patch_size appl\\(y/ies\\) to a ViT"),
        (["--weight_init", "jax"], "--weight_init appl\\(y/ies\\) to a ViT"),
        (["--drop_path_rate", "0.1"], "--drop_path_rate work\\(s\\) on a ViT's tokens or blocks"),
        (["--layer_decay", "0.75"], "--layer_decay work\\(s\\) on a ViT's tokens or blocks"),
    ],
)
def test_vit_only_flags_with_a_cnn_preset_are_refused(tmp_path, flags, message):
    with pytest.raises(UserInputError, match=message) as err:
        parse(tmp_path, "--model_preset", "resnet-tiny-cpu", *flags)
    assert "\n" not in str(err.value) and "resnet-tiny-cpu" in str(err.value)


def selection(rows=5000, seed=42, source="/data/fashion_mnist"):
    return {"source": source, "rows": rows, "of": 60000 if seed is not None else rows, "seed": seed}


def test_a_teacher_must_have_trained_on_the_student_s_rows_exactly():
    """A teacher that saw other labelled rows of the same dataset (a subset drawn by another seed, or the whole
    split) is refused, naming both selections; the same rows, another dataset, or no record pass."""
    check_teacher_rows(selection(), selection(), "t")
    check_teacher_rows(selection(source="/data/other"), selection(), "t")  # trained elsewhere: not checked
    check_teacher_rows(None, selection(), "t")  # a folder without the recipe's model_card.json
    with pytest.raises(UserInputError) as other_seed:
        check_teacher_rows(selection(seed=42), selection(seed=43), "teacher")
    message = str(other_seed.value)
    assert "5000 of the 60000 training images of /data/fashion_mnist, drawn by seed 42" in message
    assert "drawn by seed 43" in message and "Fix: train the teacher with this run's" in message
    with pytest.raises(UserInputError, match="trained on all 60000 training images"):
        check_teacher_rows(selection(rows=60000, seed=None), selection(), "teacher")
