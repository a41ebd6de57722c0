"""Tests `arguments.parse`: the defaults, files of arguments and the flags after them, flags named in refusals, the
checks of the parsed values (every float flag finite) and the one-line refusals of what the parser itself rejects."""

import json

import pytest

from hf_vit_scaling.arguments.parse import FLOAT_FLAGS, parse_args
from hf_vit_scaling.errors import UserInputError
from tests.helpers.launchers import REPO


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


def refusal(argv: list[str]) -> str:
    """The one-line message of the UserInputError that parse_args raises for argv."""
    with pytest.raises(UserInputError) as caught:
        parse_args(argv)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_float_flags_are_found_by_their_type():
    """Every float field of every group (ours and TrainingArguments'), `float | None` ones too: a new float flag is
    checked without being listed."""
    assert set(FLOAT_FLAGS) >= {
        "train_val_split", "crop_scale_min", "peak_tflops", "mixup_alpha", "ema_decay", "eval_crop_pct",
        "num_train_epochs", "learning_rate", "warmup_steps", "weight_decay", "adam_beta1", "adam_beta2",
        "adam_epsilon", "max_grad_norm", "label_smoothing_factor", "eval_steps", "save_steps", "logging_steps",
    }  # fmt: skip
    assert not {"max_steps", "image_size", "seed", "output_dir"} & set(FLOAT_FLAGS)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("flag", FLOAT_FLAGS)
def test_every_float_flag_refuses_nan_and_infinity(tmp_path, flag, value):
    message = refusal(["--output_dir", str(tmp_path), f"--{flag}={value}"])
    assert message.startswith(f"--{flag} must be a finite number, got {float(value)}. Fix:"), message


def test_float_values_of_an_args_file_are_checked_and_yaml_strings_read_as_numbers(tmp_path):
    nan_file = tmp_path / "nan.json"
    nan_file.write_text(json.dumps({"output_dir": str(tmp_path / "out"), "weight_decay": float("nan")}))  # NaN
    for argv in ([str(nan_file)], [str(nan_file), "--seed", "1"]):
        assert refusal(argv).startswith("--weight_decay must be a finite number, got nan")
    yaml_file = tmp_path / "args.yaml"
    yaml_file.write_text(f"output_dir: {tmp_path / 'out'}\nlearning_rate: 1e-4\n")  # YAML 1.1: the string '1e-4'
    assert parse_args([str(yaml_file)]).training.learning_rate == 1e-4
    yaml_file.write_text(f"output_dir: {tmp_path / 'out'}\nlearning_rate: fast\n")
    assert refusal([str(yaml_file)]).startswith("--learning_rate 'fast' is not a number")


@pytest.mark.parametrize(
    "flag, words",
    [
        ("--ds_config", ["--ds_config", "is a folder, not a file", "ds_configs/"]),
        ("--deepspeed", ["--deepspeed", "is a folder, not a file", "ds_configs/"]),
        ("--fsdp_config", ["--fsdp_config", "is a folder, not a file", "fsdp_configs/"]),
    ],
)
def test_config_file_flags_refuse_a_folder(tmp_path, flag, words):
    message = refusal(["--output_dir", str(tmp_path / "out"), flag, str(tmp_path)])
    for text in words:
        assert text in message, message


def test_unknown_flags_and_training_arguments_own_refusals_are_one_line(tmp_path):
    out = ["--output_dir", str(tmp_path)]
    assert refusal([*out, "--no_such_flag", "1"]).startswith("--no_such_flag is not a flag of this recipe. Fix:")
    args_file = tmp_path / "args.yaml"
    args_file.write_text(f"output_dir: {tmp_path / 'out'}\nlearning_rat: 0.001\n")
    assert "learning_rat is not a flag" in refusal([str(args_file)])  # without flags after the file too
    message = refusal([*out, "--logging_steps", "2.5"])  # TrainingArguments' own ValueError
    assert message.startswith("--logging_steps must be an integer") and "Fix:" in message, message


@pytest.mark.parametrize("spelling", ["--ds_config", "--ds-config", "--ds_config="])
def test_ds_config_lands_in_its_field_and_the_engine_is_resolved_once(tmp_path, spelling):
    """Every spelling of the flag argparse accepts reaches the field and TrainingArguments.deepspeed, and the
    engine read at parse time holds the very dict the Trainer builds DeepSpeed from. Fails if the value is found by
    scanning argv for one spelling (`--ds-config` was parsed and then ignored: a plain-Trainer run) or if the
    engine holds a copy."""
    path = "ds_configs/zero2.json"
    flag = [spelling + path] if spelling.endswith("=") else [spelling, path]
    args = parse_args(["--output_dir", str(tmp_path), *flag])
    assert args.engine.ds_config == path == args.run_engine.ds_config_path
    assert args.training.deepspeed == json.loads((REPO / path).read_text(encoding="utf-8"))
    assert args.run_engine.kind == "deepspeed" and args.run_engine.zero_stage == 2
    assert args.run_engine.ds_config is args.training.hf_deepspeed_config.config


def test_the_ds_config_file_is_read_once(tmp_path, monkeypatch):
    """The project checks the file and hands TrainingArguments the dict it read: transformers does not open the file
    a second time. Fails when TrainingArguments.deepspeed gets the path (2 reads: the check's and transformers')."""
    path = tmp_path / "zero2.json"
    path.write_text((REPO / "ds_configs" / "zero2.json").read_text(encoding="utf-8"), encoding="utf-8")
    reads, real_open = [], open

    def counting_open(file, *args, **kwargs):
        if str(file) == str(path):
            reads.append(file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", counting_open)
    args = parse_args(["--output_dir", str(tmp_path / "out"), "--ds_config", str(path)])
    assert len(reads) == 1 and args.run_engine.zero_stage == 2
    assert args.run_engine.ds_config_path == str(path)


def test_ds_config_from_a_file_and_the_flags_after_it(tmp_path):
    """A file's ds_config is resolved like the flag; a --ds_config after the file wins. Fails if the file's key is
    left unresolved (the run would train without DeepSpeed)."""
    args_file = tmp_path / "args.yaml"
    args_file.write_text(f"output_dir: {tmp_path / 'out'}\nds_config: ds_configs/zero2.json\n")
    assert parse_args([str(args_file)]).run_engine.zero_stage == 2
    assert parse_args([str(args_file), "--ds_config", "ds_configs/zero1.json"]).run_engine.zero_stage == 1
    assert parse_args(["--output_dir", str(tmp_path)]).run_engine.kind == "trainer"


@pytest.mark.parametrize(
    "value, accepted",
    [("off", True), ("calibrate", True), ("1,2", True), ("0.5,1.5,3", True), ("sometimes", False),
     ("1,x", False), ("1,0", False), ("1,-2", False), ("1,nan", False), ("", False)],
)  # fmt: skip
def test_balance_batches_is_checked_against_its_grammar_at_parse_time(tmp_path, value, accepted):
    """One process ignores the shares, so nothing later would notice a bad value. Fails if ClusterArguments stops
    checking --balance_batches' grammar (off, calibrate or positive shares) when it is built."""
    argv = ["--output_dir", str(tmp_path), "--balance_batches", value]
    if accepted:
        assert parse_args(argv).cluster.balance_batches == value
    else:
        message = refusal(argv)
        assert message.startswith(f"--balance_batches {value!r} is neither off, calibrate nor positive shares")
        assert "Fix: pass off, calibrate, or one positive share per rank" in message, message


@pytest.mark.parametrize("flag, value", [("on_bad_image", "sometimes"), ("lr_scaling", "cubic"),
                                         ("model_preset", "vit-huge-99"), ("input_path", "gpu")])  # fmt: skip
@pytest.mark.parametrize("overridden", [False, True])
def test_a_files_value_outside_a_flags_choices_is_refused(tmp_path, flag, value, overridden):
    """A file's values become the parser's defaults, which argparse never checks against choices. Fails if
    `require_choices` is dropped from the file path (the value would be accepted and reach the run)."""
    args_file = tmp_path / "args.yaml"
    args_file.write_text(f"output_dir: {tmp_path / 'out'}\n{flag}: {value}\n")
    message = refusal([str(args_file), *(["--seed", "3"] if overridden else [])])
    assert message.startswith(f"--{flag} {value!r} is not one of") and "Fix:" in message, message


@pytest.mark.parametrize("spelling", ["--on_bad_image", "--on-bad-image", "--on_bad_image=fail"])
def test_a_flag_given_again_after_the_file_replaces_the_files_bad_choice(tmp_path, spelling):
    """The flag after the file wins, and argparse checks that one: the file's unused value is not refused, whichever
    spelling gave the flag. Fails if the override is found by scanning argv for one spelling ("--on-bad-image" was
    refused as the file's 'sometimes')."""
    args_file = tmp_path / "args.yaml"
    args_file.write_text(f"output_dir: {tmp_path / 'out'}\non_bad_image: sometimes\n")
    override = [spelling] if "=" in spelling else [spelling, "fail"]
    assert parse_args([str(args_file), *override]).data.on_bad_image == "fail"


@pytest.mark.parametrize("argv", [["--use_cpu", "false"], ["--use-cpu", "false"], ["--use_cpu=false"]])
def test_use_cpu_given_on_the_command_line_wins_over_the_cpu_default(tmp_path, argv):
    """Without an accelerator the recipe runs on the CPU unless --use_cpu says otherwise, in any spelling. Fails if
    the default is added by scanning argv for "--use_cpu" (it appended "--use_cpu true" after "--use-cpu false")."""
    assert parse_args(["--output_dir", str(tmp_path), *argv]).training.use_cpu is False


def test_use_cpu_in_an_args_file_wins_over_the_cpu_default(tmp_path):
    args_file = tmp_path / "args.yaml"
    args_file.write_text(f"output_dir: {tmp_path / 'out'}\nuse_cpu: false\n")
    assert parse_args([str(args_file), "--seed", "3"]).training.use_cpu is False


@pytest.mark.parametrize(
    "argv, words",
    [(["--on_bad_image", "sometimes"], ["argument --on_bad_image", "invalid choice: 'sometimes'", "Fix:", "--help"]),
     (["--max_steps", "two"], ["argument --max_steps", "invalid int value: 'two'", "Fix:"])],
)  # fmt: skip
def test_argparses_own_refusals_are_one_line_user_input_errors(tmp_path, argv, words):
    """Fails if the recipe's parser lets argparse print usage and exit (SystemExit, not a UserInputError)."""
    message = refusal(["--output_dir", str(tmp_path), *argv])
    assert all(word in message for word in words), message
