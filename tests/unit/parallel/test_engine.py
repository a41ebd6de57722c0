"""Which engine a run uses, as the done line, the report and the card name it."""

from types import SimpleNamespace

import pytest
from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

from hf_vit_scaling.parallel.deepspeed_config import bucket_flushes
from hf_vit_scaling.parallel.engine import Engine, engine_of

OFFLOAD_ZERO2 = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}


def _hf_config(config: dict, mismatches=()):
    """Stands in for transformers' HfTrainerDeepSpeedConfig: its `config` dict and `mismatches` lines."""
    return SimpleNamespace(config=config, mismatches=list(mismatches))


def test_deepspeed_engine_from_training_arguments():
    engine = engine_of(_hf_config(OFFLOAD_ZERO2), ds_config_path="ds_configs/zero2_offload.json")
    assert engine.kind == "deepspeed" and engine.zero_stage == 2 and engine.label() == "ZeRO-2"
    assert engine.offload == {"optimizer": "cpu"} and engine.ds_config_path == "ds_configs/zero2_offload.json"


def test_plain_trainer_engine():
    engine = engine_of()
    assert engine == Engine("trainer") and engine.zero_stage is None and engine.offload == {}
    assert engine.label() == "no DeepSpeed"


def test_a_config_given_as_a_dict_has_no_path():
    engine = engine_of(_hf_config({"zero_optimization": {"stage": 3}}))
    assert engine.ds_config_path is None and engine.label() == "ZeRO-3"


FSDP2_PLUGIN = {"fsdp_version": 2, "transformer_cls_names_to_wrap": "ViTLayer", "state_dict_type": "FULL_STATE_DICT",
                "reshard_after_forward": True}  # fmt: skip


def test_fsdp2_engine_from_training_arguments():
    engine = engine_of(fsdp_plugin_args=FSDP2_PLUGIN)
    assert engine.kind == "fsdp" and engine.label() == "FSDP2" and engine.zero_stage is None and engine.offload == {}
    assert engine.describe() == "FSDP2 (fully_shard per ViTLayer, parameters resharded after forward, FULL_STATE_DICT)"


def test_fsdp2_offload_is_named_like_deepspeed_offload():
    engine = engine_of(fsdp_plugin_args=FSDP2_PLUGIN | {"cpu_offload": True})
    assert engine.label() == "FSDP2 + CPU offload" and engine.offload == {"optimizer": "cpu", "param": "cpu"}


def test_deepspeed_wins_only_when_given():
    assert engine_of(_hf_config(OFFLOAD_ZERO2), fsdp_plugin_args=FSDP2_PLUGIN).kind == "deepspeed"
    assert engine_of(_hf_config(OFFLOAD_ZERO2, ["- train_batch_size=8 vs 16 "])).ds_config_mismatches == (
        "train_batch_size=8 vs 16",
    )


def test_the_card_engine_row_names_the_engine_not_the_config_file():
    """The card has a ds_config row with the file; its engine row says what ran (it held the same path before)."""
    zero3 = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}
    path = "ds_configs/zero3_offload.json"
    assert (
        engine_of(_hf_config(zero3), ds_config_path=path).describe() == "DeepSpeed ZeRO-3 (offload: optimizer to cpu)"
    )
    zero2 = {"zero_optimization": {"stage": 2}}
    assert engine_of(_hf_config(zero2), ds_config_path="ds_configs/zero2.json").describe() == "DeepSpeed ZeRO-2"


def _meta_model(preset: str = "vit-b-16", image_size: int = 224):
    """A preset's real parameter list, 10 classes, built on the meta device (ViT-B/16 at 224 px by default: 200
    tensors, 85.8 M)."""
    import torch

    from hf_vit_scaling.models.presets import build_model_from_preset, preset_config

    with torch.device("meta"):
        return build_model_from_preset(preset_config(preset, [str(i) for i in range(10)], image_size=image_size))


def test_zero3_keeps_a_model_whole_on_several_processes_when_every_tensor_is_under_deepspeed_s_default():
    """The tiny preset's largest tensor (96 x 192 = 18,432 elements) is under DeepSpeed's 1e5: on 2 processes every
    tensor stays whole, as DeepSpeed's own default would keep it. Fails with the earlier rule, one above the largest
    1-D tensor alone (193 here), which partitioned every matrix and gathered it twice a step."""
    model = _meta_model("vit-tiny-cpu", image_size=16)
    assert max(p.numel() for p in model.parameters()) == 96 * 192
    engine = Engine("deepspeed", {"zero_optimization": {"stage": 3}})
    engine.resolve_for_model(model, world_size=2)
    assert engine.ds_config["zero_optimization"]["stage3_param_persistence_threshold"] == 100_000
    reason = engine.resolved["zero_optimization.stage3_param_persistence_threshold"]["reason"]
    assert "every tensor is smaller, all kept whole" in reason


def test_vit_b16_gradient_buckets_flush_at_most_4_times_a_step_where_auto_flushed_147():
    """transformers' "auto" (hidden^2 = 589,824) flushes 147 times a step on ViT-B/16; the resolved bucket at most
    4 times on several processes (overlapping the backward) and once on one."""
    model = _meta_model()
    numels = [p.numel() for p in model.parameters()][::-1]  # backward produces the last layers' gradients first
    assert len(numels) == 200 and bucket_flushes(numels, 768 * 768) == 147
    for world, most in ((2, 4), (8, 4), (1, 1)):
        engine = Engine("deepspeed", {"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}})
        engine.resolve_for_model(model, world_size=world)
        bucket = engine.ds_config["zero_optimization"]["reduce_bucket_size"]
        assert bucket_flushes(numels, bucket) <= most and bucket % 512 == 0
        assert engine.ds_config["zero_optimization"]["allgather_bucket_size"] == bucket  # absent: resolved too
        assert "gradient flush" in engine.resolved["zero_optimization.reduce_bucket_size"]["reason"]
    assert bucket == 85_806_592 < 5e8  # one process: every gradient in one bucket, a sixth of DeepSpeed's 5e8


def test_zero3_values_come_from_the_model_and_a_number_the_user_wrote_wins():
    model = _meta_model()
    config = {"zero_optimization": {"stage": 3, "reduce_bucket_size": 12345678, "stage3_prefetch_bucket_size": "auto",
                                    "stage3_param_persistence_threshold": "auto"}}  # fmt: skip
    engine = Engine("deepspeed", config)
    engine.resolve_for_model(model, world_size=2)
    zero = config["zero_optimization"]
    assert zero["reduce_bucket_size"] == 12345678 and "zero_optimization.reduce_bucket_size" not in engine.resolved
    assert zero["stage3_prefetch_bucket_size"] == 30_961_664  # 85,806,346 / 3 + 2,359,296, to a multiple of 512
    # DeepSpeed's default 1e5: its 1-D tensors (at most 3,072 elements) and the 10-class head (7,680) whole, every
    # 768 x 768 and larger matrix partitioned
    assert zero["stage3_param_persistence_threshold"] == 100_000 == DeepSpeedZeroConfig().param_persistence_threshold
    assert zero["leaf_module"] == {"classes": ["transformers.models.vit.modeling_vit.ViTLayer"]}
    assert config["timers"] == {"throughput": {"enabled": False}}
    mine = {"zero_optimization": {"stage": 3}, "timers": {"throughput": {"enabled": True}}}
    Engine("deepspeed", mine).resolve_for_model(model, world_size=1)
    assert mine["timers"] == {"throughput": {"enabled": True}}  # the user's timers stay
    # One process: a partition over one rank is the whole tensor, so every tensor stays whole (the largest: an MLP
    # matrix, 768 x 3072 = 2,359,296 elements) and no gather runs.
    assert mine["zero_optimization"]["stage3_param_persistence_threshold"] == 2_359_296 + 1
    # Unless the weights are offloaded: DeepSpeed keeps a persistent tensor on the device (partition_parameters.py,
    # `if param.ds_persist: device = self.local_device`), so "whole" would bring every offloaded weight back.
    offloaded = {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}
    Engine("deepspeed", offloaded).resolve_for_model(model, world_size=1)
    assert offloaded["zero_optimization"]["stage3_param_persistence_threshold"] == 100_000
    plain = Engine("trainer")
    plain.resolve_for_model(model, world_size=1)
    assert plain.resolved == {}


@pytest.mark.parametrize(
    "preset, image_size, world, written, resolved",
    [
        ("vit-tiny-cpu", 16, 2, {}, False),  # every tensor under 1e5: all kept whole
        ("vit-b-16", 224, 1, {}, False),  # one process: all kept whole
        ("vit-b-16", 224, 2, {}, None),  # its matrices partitioned: DeepSpeed's default (on) stays
        ("vit-tiny-cpu", 16, 2, {"memory_efficient_linear": True}, True),  # the user's value wins
        ("vit-tiny-cpu", 16, 2, {"stage3_param_persistence_threshold": 1000}, None),  # the user's threshold: left
    ],
)
def test_zero3_puts_torch_s_linear_back_where_every_tensor_is_kept_whole(
    monkeypatch, preset, image_size, world, written, resolved
):
    """ZeRO-3's `zero.Init` replaces `torch.nn.functional.linear` for the whole process with DeepSpeed's linear, which
    re-fetches a released weight in the backward (DeepSpeed's own `_enable_mem_efficient_linear` does it here, as
    zero.Init calls it). Where the resolution keeps every tensor whole, nothing is ever released: it resolves
    `memory_efficient_linear` off and torch's linear is back. Elsewhere DeepSpeed's stays."""
    import torch
    from deepspeed.runtime.zero import partition_parameters
    from deepspeed.runtime.zero.linear import zero3_linear_wrap

    monkeypatch.setattr(partition_parameters, "print_rank_0", lambda *args, **kwargs: None)  # needs a process group
    monkeypatch.setattr(torch.nn.functional, "linear", torch._C._nn.linear)  # put back after the test
    init = partition_parameters.InsertPostInitMethodToModuleSubClasses
    init._enable_mem_efficient_linear(init.__new__(init))
    assert torch.nn.functional.linear is zero3_linear_wrap
    config = {"zero_optimization": {"stage": 3, **written}}
    engine = Engine("deepspeed", config)
    engine.resolve_for_model(_meta_model(preset, image_size), world_size=world)
    assert config["zero_optimization"].get("memory_efficient_linear") is resolved
    assert torch.nn.functional.linear is (torch._C._nn.linear if resolved is False else zero3_linear_wrap)
    if resolved is False:
        assert "torch's own linear" in engine.resolved["zero_optimization.memory_efficient_linear"]["reason"]


def test_a_frozen_weight_too_large_to_keep_whole_keeps_deepspeed_s_linear():
    """A parameter that is not trained is partitioned and released like any other: over DeepSpeed's 1e5 on 2
    processes, the tiny preset no longer has every tensor whole, so DeepSpeed's linear stays."""
    import torch

    model = _meta_model("vit-tiny-cpu", image_size=16)
    model.register_parameter("frozen", torch.nn.Parameter(torch.empty(200_000, device="meta"), requires_grad=False))
    config = {"zero_optimization": {"stage": 3}}
    Engine("deepspeed", config).resolve_for_model(model, world_size=2)
    assert config["zero_optimization"]["stage3_param_persistence_threshold"] == 100_000
    assert "memory_efficient_linear" not in config["zero_optimization"]


@pytest.mark.parametrize(
    ("installed", "refused"), [("0.19.0", False), ("0.19.8", False), ("0.18.9", True), ("0.19.9", True)]
)
def test_a_deepspeed_outside_the_tested_range_is_one_error_before_the_model(installed, refused):
    """pip refuses such a version for the package; one installed around it (--no-deps) stops here, not in a fast
    path's pin reading or DeepSpeed's own crash (0.17-0.18.2 raised AttributeError at start)."""
    from hf_vit_scaling.errors import UserInputError
    from hf_vit_scaling.parallel.engine import check_deepspeed_version

    if not refused:
        check_deepspeed_version(installed, ">=0.19.0,<=0.19.8")
        return
    with pytest.raises(UserInputError, match=f"DeepSpeed {installed} is outside") as err:
        check_deepspeed_version(installed, ">=0.19.0,<=0.19.8")
    assert "pip install 'deepspeed>=0.19.0,<=0.19.8'" in str(err.value)


def test_the_tested_range_is_setup_cfg_s():
    from hf_vit_scaling.parallel.engine import tested_deepspeed_range
    from tests.helpers.deepspeed_range import deepspeed_range

    lowest, highest = deepspeed_range()
    assert tested_deepspeed_range() in (f">={lowest},<={highest}", f"<={highest},>={lowest}")
