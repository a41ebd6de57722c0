"""Argument parsing and validation: files of arguments, flags named in every refusal, DeepSpeed config checks, the
Hub token kept out of the saved arguments, and the checks of a torchrun restart setup."""

import json
import os
import pickle

import pytest

from hf_vit_scaling.arguments.checks import check_restart_setup
from hf_vit_scaling.arguments.data import DataArguments
from hf_vit_scaling.arguments.parse import parse_args
from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.parallel.deepspeed_config import load_ds_config, offload_targets, zero_stage
from hf_vit_scaling.parallel.hetero import parse_slow_ranks
from tests.helpers.launchers import DS_CONFIGS


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


def test_ds_config_checks(tmp_path):
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json")
    with pytest.raises(UserInputError, match="not valid JSON"):
        load_ds_config(str(bad_json))
    not_object = tmp_path / "list.json"
    not_object.write_text("[1, 2]")
    with pytest.raises(UserInputError, match="JSON object"):
        load_ds_config(str(not_object))
    stage7 = tmp_path / "stage7.json"
    stage7.write_text(json.dumps({"zero_optimization": {"stage": 7}}))
    with pytest.raises(UserInputError, match="stage is 7"):
        load_ds_config(str(stage7))


def test_shipped_configs_leave_trainer_owned_values_auto():
    for path in sorted(DS_CONFIGS.glob("*.json")):
        config = load_ds_config(str(path))
        for key in (
            "train_batch_size",
            "train_micro_batch_size_per_gpu",
            "gradient_accumulation_steps",
            "gradient_clipping",
        ):
            assert config[key] == "auto", (path.name, key)
        assert "scheduler" not in config, path.name  # the Trainer's --lr_scheduler_type stays in charge
        for value in config.get("optimizer", {}).get("params", {}).values():
            assert value == "auto", path.name
        stage = int(path.stem[4])
        assert zero_stage(config) == stage
        assert bool(offload_targets(config)) == path.stem.endswith("offload")


def test_zero3_configs_gather_weights_on_save():
    for path in DS_CONFIGS.glob("zero3*.json"):
        assert load_ds_config(str(path))["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True


def test_parse_slow_ranks():
    assert parse_slow_ranks("1:2.0,3:1.5") == {1: 2.0, 3: 1.5}
    assert parse_slow_ranks(None) == {}


def test_hub_token_never_stays_in_the_arguments(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    secret = "hf_unitTestToken42"
    training_args = parse_args(["--output_dir", str(tmp_path), "--hub_token", secret]).training
    assert training_args.hub_token is None
    assert secret.encode() not in pickle.dumps(training_args)  # what training_args.bin holds
    assert os.environ["HF_TOKEN"] == secret  # where huggingface_hub finds it for the upload


def test_skip_policy_with_accumulation_is_refused(tmp_path):
    with pytest.raises(UserInputError, match="--gradient_accumulation_steps 1"):
        parse_args(
            ["--output_dir", str(tmp_path), "--on_nonfinite_loss", "skip", "--gradient_accumulation_steps", "2"]
        )


def test_torchrun_restarts_need_latest_and_a_fresh_store_per_attempt(tmp_path):
    """The environment torchrun gives its workers (printed from a real torchrun worker: TORCHELASTIC_USE_AGENT_STORE
    is True with the default static rendezvous and with c10d, False with c10d +
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)."""
    training_args = parse_args(["--output_dir", str(tmp_path)]).training
    static = {"TORCHELASTIC_MAX_RESTARTS": "1", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    fresh_store = {"TORCHELASTIC_MAX_RESTARTS": "1", "TORCHELASTIC_USE_AGENT_STORE": "False"}
    with pytest.raises(UserInputError, match="--resume_from_checkpoint latest"):
        check_restart_setup(training_args, fresh_store)
    training_args.resume_from_checkpoint = "latest"
    with pytest.raises(UserInputError, match="TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --rdzv-backend c10d"):
        check_restart_setup(training_args, static)
    check_restart_setup(training_args, fresh_store)  # the launch the message recommends
    check_restart_setup(training_args, {"TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_USE_AGENT_STORE": "True"})


def test_class_weighting_is_refused_beside_soft_targets(tmp_path):
    base = ["--output_dir", str(tmp_path), "--class_weighting", "balanced"]
    assert parse_args(base).data.class_weighting == "balanced"
    for extra in (["--mixup_alpha", "0.2"], ["--label_smoothing_factor", "0.1"]):
        with pytest.raises(UserInputError, match="--class_weighting cannot be combined"):
            parse_args(base + extra)


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--per_device_train_batch_size", "0"], "--per_device_train_batch_size"),
        (["--per_device_eval_batch_size", "-2"], "--per_device_eval_batch_size"),
        (["--gradient_accumulation_steps", "0"], "--gradient_accumulation_steps"),
        (["--learning_rate", "-1"], "--learning_rate"),
        (["--num_train_epochs", "0"], "--num_train_epochs"),
        (["--max_steps", "0"], "--max_steps"),
    ],
)
def test_training_numbers_are_refused_before_anything_loads(tmp_path, argv, flag):
    with pytest.raises(UserInputError, match=flag):
        parse_args(["--output_dir", str(tmp_path), *argv])


@pytest.mark.parametrize("flag, size, crops", [(None, 28, False), (None, 63, False), (None, 64, True),
                                               (None, 224, True), (True, 28, True), (False, 224, False)])  # fmt: skip
def test_crop_and_flip_default_by_image_size_unless_given(flag, size, crops):
    assert DataArguments(random_resized_crop=flag).crops_at(size) is crops
    assert DataArguments(horizontal_flip=flag).flips_at(size) is crops
