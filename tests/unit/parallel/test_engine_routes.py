"""Tests `parallel.engine_routes`: what `accelerate launch` hands a script for its DeepSpeed and FSDP plugins, read
into the values TrainingArguments builds the engine from, and the keys a bare DeepSpeed config leaves out.
Through `parse_args`: tests/unit/arguments/test_engine_routes.py; launched: tests/launched/test_engine_routes.py."""

import pytest

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.parallel.engine_routes import (
    TRAINER_OWNED_KEYS,
    accelerate_deepspeed,
    accelerate_fsdp,
    fill_left_out_keys,
)

# What `accelerate launch --use_deepspeed --zero_stage 3 --offload_param_device cpu` exports (accelerate/utils/
# launch.py)
DEEPSPEED_FLAGS = {
    "ACCELERATE_USE_DEEPSPEED": "true",
    "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3",
    "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE": "cpu",
}


def test_no_accelerate_plugin_no_route():
    assert accelerate_deepspeed({}) is None and accelerate_fsdp({}) is None
    assert accelerate_deepspeed({"ACCELERATE_USE_DEEPSPEED": "false"}) is None


def test_accelerate_s_config_file_is_handed_back_as_its_path():
    env = {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_CONFIG_FILE": "ds_configs/zero2.json"}
    source, route = accelerate_deepspeed(env)
    assert source == "ds_configs/zero2.json" and route == "accelerate's deepspeed_config_file ds_configs/zero2.json"


def test_accelerate_s_own_fields_become_accelerate_s_dict_with_the_batch_left_to_the_trainer(monkeypatch):
    """accelerate's DeepSpeedPlugin builds the dict (not a copy of its rules here): stage and offload from its
    variables, batch sizes "auto"; its never-print `inf` replaced by a JSON number."""
    for name, value in DEEPSPEED_FLAGS.items():
        monkeypatch.setenv(name, value)
    config, route = accelerate_deepspeed(DEEPSPEED_FLAGS)
    assert config["zero_optimization"]["stage"] == 3
    assert config["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert config["train_micro_batch_size_per_gpu"] == "auto" and config["train_batch_size"] == "auto"
    assert config["steps_per_print"] == 10**9
    assert route == "accelerate's DeepSpeed plugin (zero_stage 3, offload_param_device cpu)"


def test_accelerate_s_fsdp_variables_become_transformers_fsdp_config():
    env = {
        "ACCELERATE_USE_FSDP": "true",
        "FSDP_VERSION": "2",
        "FSDP_RESHARD_AFTER_FORWARD": "false",
        "FSDP_OFFLOAD_PARAMS": "false",
        "FSDP_STATE_DICT_TYPE": "SHARDED_STATE_DICT",
        "FSDP_TRANSFORMER_CLS_TO_WRAP": "ViTLayer",
    }
    assert accelerate_fsdp(env) == {
        "version": 2,
        "reshard_after_forward": False,
        "cpu_offload": False,
        "state_dict_type": "SHARDED_STATE_DICT",
        "transformer_layer_cls_to_wrap": ["ViTLayer"],
    }


def test_accelerate_s_fsdp_without_a_layer_to_wrap_is_one_error_naming_the_flag():
    with pytest.raises(UserInputError, match="--fsdp_transformer_layer_cls_to_wrap ViTLayer"):
        accelerate_fsdp({"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"})


def test_a_bare_config_gets_every_trainer_owned_key_as_auto_and_zero3_its_model_save():
    """`{"zero_optimization": {"stage": 3}}` stopped in DeepSpeed ("Either train_batch_size or
    train_micro_batch_size_per_gpu needs to be provided") and would have saved no model.safetensors."""
    config = {"zero_optimization": {"stage": 3}}
    filled = dict(fill_left_out_keys(config))
    assert set(filled) == {*TRAINER_OWNED_KEYS, "zero_optimization.stage3_gather_16bit_weights_on_model_save"}
    assert config["train_batch_size"] == "auto" and config["bf16"] == {"enabled": "auto"}
    assert config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True


def test_values_the_user_wrote_stand():
    config = {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_clipping": 0.5,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": False},
    }
    filled = dict(fill_left_out_keys(config))
    assert "train_micro_batch_size_per_gpu" not in filled and "gradient_clipping" not in filled
    assert config["train_micro_batch_size_per_gpu"] == 8 and config["gradient_clipping"] == 0.5
    assert config["bf16"] == {"enabled": True}
    assert config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is False
    assert fill_left_out_keys({"zero_optimization": {"stage": 2}, **dict.fromkeys(TRAINER_OWNED_KEYS[:4], 1),
                               "bf16": {"enabled": False}, "fp16": {"enabled": False}}) == ()  # fmt: skip
