"""Tests `arguments.parse`: the defaults, files of arguments and the flags after them, flags named in refusals."""

import json

import pytest

from hf_vit_scaling.arguments.parse import parse_args
from hf_vit_scaling.errors import UserInputError


def test_defaults_parse_and_cpu_is_chosen_without_accelerator(tmp_path):
    args = parse_args(["--output_dir", str(tmp_path)])
    assert args.model.model_preset is None and args.model.model_name_or_path is None
    assert args.model.preset == "vit-tiny-cpu"
    assert args.data.dataset_name is None  # built-in digits
    assert args.engine.ds_config is None and args.training.deepspeed is None
    assert args.training.use_cpu is True


def test_lone_json_file_is_parsed(tmp_path):
    args_file = tmp_path / "args.json"
    args_file.write_text(
        json.dumps(
            {
                "output_dir": str(tmp_path / "out"),
                "model_preset": "vit-s-16",
                "per_device_train_batch_size": 7,
                "crop_scale_min": 0.3,
            }
        )
    )
    args = parse_args([str(args_file)])
    assert args.model.model_preset == "vit-s-16"
    assert args.training.per_device_train_batch_size == 7
    assert args.data.crop_scale_min == 0.3


def test_lone_yaml_file_is_parsed(tmp_path):
    args_file = tmp_path / "args.yaml"
    args_file.write_text(f"output_dir: {tmp_path / 'out'}\nmodel_preset: vit-ti-16\nhorizontal_flip: false\n")
    args = parse_args([str(args_file)])
    assert args.model.model_preset == "vit-ti-16" and args.data.horizontal_flip is False


def test_flags_after_an_args_file_override_its_values(tmp_path):
    args_file = tmp_path / "args.yaml"
    args_file.write_text(f"output_dir: {tmp_path / 'out'}\nseed: 42\nlearning_rate: 0.001\nhorizontal_flip: false\n")
    args = parse_args([str(args_file), "--seed", "43", "--output_dir", str(tmp_path / "out43")])
    assert args.training.seed == 43 and args.training.output_dir == str(tmp_path / "out43")
    assert args.training.learning_rate == 0.001 and args.data.horizontal_flip is False  # the file's, untouched


def test_overridden_args_file_with_an_unknown_key_names_it(tmp_path):
    args_file = tmp_path / "args.yaml"
    args_file.write_text(f"output_dir: {tmp_path / 'out'}\nlearning_rat: 0.001\n")
    with pytest.raises(UserInputError, match="learning_rat is not a flag"):
        parse_args([str(args_file), "--seed", "43"])


def test_overrides_are_checked_like_any_flag(tmp_path):
    args_file = tmp_path / "args.yaml"
    args_file.write_text(f"output_dir: {tmp_path / 'out'}\n")
    with pytest.raises(UserInputError, match="--crop_scale_min"):
        parse_args([str(args_file), "--crop_scale_min", "1.5"])


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--model_preset", "vit-b-16", "--model_name_or_path", "google/vit-base-patch16-224"], "--model_preset"),
        (["--model_name_or_path", "x", "--patch_size", "8"], "--patch_size"),
        (["--dataset_name", "a", "--train_dir", "b"], "--dataset_name"),
        (["--validation_dir", "b"], "--validation_dir"),
        (["--train_dir", "/does/not/exist"], "--train_dir"),
        (["--train_val_split", "1.5"], "--train_val_split"),
        (["--max_train_samples", "0"], "--max_train_samples"),
        (["--simulate_slow_ranks", "1-2"], "--simulate_slow_ranks"),
        (["--simulate_slow_ranks", "1:0.5"], "--simulate_slow_ranks"),
        (["--ds_config", "/nope.json"], "--ds_config"),
    ],
)
def test_bad_arguments_name_the_flag(tmp_path, argv, flag):
    with pytest.raises(UserInputError, match=flag):
        parse_args(["--output_dir", str(tmp_path), *argv])
