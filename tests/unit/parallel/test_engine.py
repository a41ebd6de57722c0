"""Which engine a run uses, as the done line, the report and the card name it."""

from types import SimpleNamespace

from hf_vit_scaling.parallel.engine import Engine, engine_of

OFFLOAD_ZERO2 = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}


def test_deepspeed_engine_from_training_arguments():
    args = SimpleNamespace(deepspeed="ds_configs/zero2_offload.json",
                           hf_deepspeed_config=SimpleNamespace(config=OFFLOAD_ZERO2))  # fmt: skip
    engine = engine_of(args)
    assert engine.kind == "deepspeed" and engine.zero_stage == 2 and engine.label() == "ZeRO-2"
    assert engine.offload == {"optimizer": "cpu"} and engine.ds_config_path == "ds_configs/zero2_offload.json"


def test_plain_trainer_engine():
    engine = engine_of(SimpleNamespace(deepspeed=None, fsdp_plugin_args=None))
    assert engine == Engine("trainer") and engine.zero_stage is None and engine.offload == {}
    assert engine.label() == "no DeepSpeed"


def test_a_config_given_as_a_dict_has_no_path():
    zero3 = {"zero_optimization": {"stage": 3}}
    args = SimpleNamespace(deepspeed=zero3, hf_deepspeed_config=SimpleNamespace(config=zero3))
    assert engine_of(args).ds_config_path is None and engine_of(args).label() == "ZeRO-3"


FSDP2_PLUGIN = {"fsdp_version": 2, "transformer_cls_names_to_wrap": "ViTLayer", "state_dict_type": "FULL_STATE_DICT",
                "reshard_after_forward": True}  # fmt: skip


def test_fsdp2_engine_from_training_arguments():
    engine = engine_of(SimpleNamespace(deepspeed=None, fsdp_plugin_args=FSDP2_PLUGIN))
    assert engine.kind == "fsdp" and engine.label() == "FSDP2" and engine.zero_stage is None and engine.offload == {}
    assert engine.describe() == "FSDP2 (fully_shard per ViTLayer, parameters resharded after forward, FULL_STATE_DICT)"


def test_fsdp2_offload_is_named_like_deepspeed_offload():
    engine = engine_of(SimpleNamespace(deepspeed=None, fsdp_plugin_args=FSDP2_PLUGIN | {"cpu_offload": True}))
    assert engine.label() == "FSDP2 + CPU offload" and engine.offload == {"optimizer": "cpu", "param": "cpu"}


def test_deepspeed_wins_only_when_given():
    args = SimpleNamespace(deepspeed="z.json", hf_deepspeed_config=SimpleNamespace(config=OFFLOAD_ZERO2),
                           fsdp_plugin_args=None)  # fmt: skip
    assert engine_of(args).kind == "deepspeed"


def test_the_card_engine_row_names_the_engine_not_the_config_file():
    """The card has a ds_config row with the file; its engine row says what ran (it held the same path before)."""
    zero3 = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}
    path = "ds_configs/zero3_offload.json"
    args = SimpleNamespace(deepspeed=path, hf_deepspeed_config=SimpleNamespace(config=zero3))
    assert engine_of(args).describe() == "DeepSpeed ZeRO-3 (offload: optimizer to cpu)"
    zero2 = {"zero_optimization": {"stage": 2}}
    args = SimpleNamespace(deepspeed="ds_configs/zero2.json", hf_deepspeed_config=SimpleNamespace(config=zero2))
    assert engine_of(args).describe() == "DeepSpeed ZeRO-2"
