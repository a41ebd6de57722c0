"""Tests every route to an engine through `arguments.parse.parse_args`: accelerate's DeepSpeed plugin (its config
file or its own fields) and FSDP plugin reach TrainingArguments as the recipe's own flags do, a bare DeepSpeed config
trains, and two routes that disagree are one error naming both. The routes' pieces: tests/unit/parallel/
test_engine_routes.py; whole runs compared with the --ds_config route: tests/launched/test_engine_routes.py."""

import pytest

from hf_vit_scaling.arguments.parse import parse_args
from hf_vit_scaling.errors import UserInputError

ZERO2, ZERO3 = "ds_configs/zero2.json", "ds_configs/zero3.json"
ACCELERATE_DS = ("ACCELERATE_USE_DEEPSPEED", "ACCELERATE_DEEPSPEED_CONFIG_FILE", "ACCELERATE_DEEPSPEED_ZERO_STAGE",
                 "ACCELERATE_USE_FSDP", "FSDP_VERSION", "FSDP_TRANSFORMER_CLS_TO_WRAP")  # fmt: skip


@pytest.fixture
def launched_by(monkeypatch):
    """`launched_by(VAR=value, ...)`: the variables `accelerate launch` would export, and no others of its."""
    for name in ACCELERATE_DS:
        monkeypatch.delenv(name, raising=False)

    def set_env(**variables):
        for name, value in variables.items():
            monkeypatch.setenv(name, value)

    return set_env


def test_accelerate_s_deepspeed_config_file_is_the_run_s_engine(tmp_path, launched_by):
    """Was the plain Trainer to the project (report "plain Trainer (DDP)", card "none", no model-sized values) while
    the Trainer built DeepSpeed late from accelerate's variables."""
    launched_by(ACCELERATE_USE_DEEPSPEED="true", ACCELERATE_DEEPSPEED_CONFIG_FILE=ZERO2)
    args = parse_args(["--output_dir", str(tmp_path)])
    engine = args.run_engine
    assert engine.kind == "deepspeed" and engine.zero_stage == 2 and engine.ds_config_path == ZERO2
    assert engine.route == f"accelerate's deepspeed_config_file {ZERO2}"
    assert engine.ds_config is args.training.hf_deepspeed_config.config


def test_accelerate_s_own_deepspeed_fields_are_the_run_s_engine(tmp_path, launched_by):
    launched_by(ACCELERATE_USE_DEEPSPEED="true", ACCELERATE_DEEPSPEED_ZERO_STAGE="3")
    engine = parse_args(["--output_dir", str(tmp_path), "--per_device_train_batch_size", "4"]).run_engine
    assert engine.kind == "deepspeed" and engine.zero_stage == 3
    assert engine.ds_config["train_micro_batch_size_per_gpu"] == 4  # the Trainer filled accelerate's "auto"
    assert engine.route == "accelerate's DeepSpeed plugin (zero_stage 3)"


def test_accelerate_s_fsdp_plugin_is_the_run_s_fsdp2(tmp_path, launched_by):
    launched_by(ACCELERATE_USE_FSDP="true", FSDP_VERSION="2", FSDP_TRANSFORMER_CLS_TO_WRAP="ViTLayer")
    with pytest.raises(UserInputError, match="--fsdp: --fsdp shards over the processes"):  # 1 process here
        parse_args(["--output_dir", str(tmp_path)])


def test_a_bare_deepspeed_config_gets_the_trainer_s_batch(tmp_path):
    bare = tmp_path / "bare.json"
    bare.write_text('{"zero_optimization": {"stage": 2}}')
    engine = parse_args(["--output_dir", str(tmp_path), "--ds_config", str(bare), "--per_device_train_batch_size",
                         "4", "--gradient_accumulation_steps", "2"]).run_engine  # fmt: skip
    assert (
        engine.ds_config["train_micro_batch_size_per_gpu"] == 4
        and engine.ds_config["gradient_accumulation_steps"] == 2
    )
    assert engine.resolved["train_micro_batch_size_per_gpu"] == {
        "value": 4,
        "reason": "left out of the config: the Trainer's value",
    }


@pytest.mark.parametrize(
    ("env", "argv", "words"),
    [
        ({"ACCELERATE_DEEPSPEED_CONFIG_FILE": ZERO3}, ["--ds_config", ZERO2],
         [repr(ZERO2), f"accelerate's deepspeed_config_file {ZERO3}", "two DeepSpeed configs"]),
        ({"ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}, ["--ds_config", ZERO2],
         [repr(ZERO2), "zero_optimization.stage 2", "accelerate's DeepSpeed plugin (zero_stage 3)"]),
        ({"ACCELERATE_DEEPSPEED_CONFIG_FILE": ZERO2, "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}, [],
         [repr(ZERO2), "zero_optimization.stage 2", "zero_stage 3"]),
        ({"ACCELERATE_DEEPSPEED_ZERO_STAGE": "2"}, ["--fsdp", "--fsdp_config", "fsdp_configs/fsdp2.json"],
         ["--fsdp and accelerate's DeepSpeed plugin (zero_stage 2) name two engines"]),
    ],
)  # fmt: skip
def test_two_routes_that_disagree_are_one_error_naming_both(tmp_path, launched_by, env, argv, words):
    launched_by(ACCELERATE_USE_DEEPSPEED="true", **env)
    with pytest.raises(UserInputError) as err:
        parse_args(["--output_dir", str(tmp_path), *argv])
    assert len(str(err.value).splitlines()) == 1 and all(word in str(err.value) for word in words), str(err.value)


def test_accelerate_s_fsdp_beside_a_deepspeed_flag_is_one_error(tmp_path, launched_by):
    launched_by(ACCELERATE_USE_FSDP="true", FSDP_VERSION="2", FSDP_TRANSFORMER_CLS_TO_WRAP="ViTLayer")
    with pytest.raises(UserInputError, match="--ds_config 'ds_configs/zero2.json' and accelerate's FSDP plugin"):
        parse_args(["--output_dir", str(tmp_path), "--ds_config", ZERO2])


def test_the_same_config_named_twice_is_one_engine(tmp_path, launched_by):
    launched_by(ACCELERATE_USE_DEEPSPEED="true", ACCELERATE_DEEPSPEED_CONFIG_FILE=ZERO2)
    engine = parse_args(["--output_dir", str(tmp_path), "--ds_config", ZERO2]).run_engine
    assert engine.zero_stage == 2 and engine.route.startswith(f"--ds_config {ZERO2} (also named by accelerate's")


def test_a_deepspeed_mapping_in_an_arguments_file_is_a_route_of_its_own(tmp_path):
    args_file = tmp_path / "args.yaml"
    args_file.write_text(f"output_dir: {tmp_path / 'out'}\ndeepspeed:\n  zero_optimization:\n    stage: 1\n")
    engine = parse_args([str(args_file)]).run_engine
    assert engine.kind == "deepspeed" and engine.zero_stage == 1
    assert engine.route == "--deepspeed (a mapping in the arguments file)" and "train_batch_size" in engine.resolved
