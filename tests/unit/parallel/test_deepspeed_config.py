"""Tests `parallel.deepspeed_config`: reading a DeepSpeed config, the shipped configs."""

import json

import pytest

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.parallel.deepspeed_config import load_ds_config, read_config
from tests.helpers.launchers import DS_CONFIGS


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
        assert read_config(config).zero_stage == stage
        assert bool(read_config(config).offload) == path.stem.endswith("offload")


def test_zero3_configs_gather_weights_on_save():
    for path in DS_CONFIGS.glob("zero3*.json"):
        assert load_ds_config(str(path))["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
