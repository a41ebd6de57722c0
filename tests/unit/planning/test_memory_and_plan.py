"""The planner's arithmetic, checked by hand on a config small enough to count on paper."""

import dataclasses

import pytest
import torch
from transformers import ViTConfig, ViTForImageClassification

from hf_vit_scaling.models.flops import vit_forward_macs_per_image
from hf_vit_scaling.models.presets import MODEL_PRESETS
from hf_vit_scaling.planning.memory import (
    PlanSettings,
    engine_memory,
    largest_batch,
    model_state_bytes,
    zero3_gathered_parameters,
)
from hf_vit_scaling.planning.plan import plan, recommend
from hf_vit_scaling.planning.shapes import ENGINES, GiB, VitShape, activation_bytes, vit_shape
from hf_vit_scaling.planning.speed import collective_bytes_per_rank, engine_speed

# 32 px, patch 16 -> 2 x 2 patches + CLS = 5 tokens; hidden 8, 2 layers, 2 heads, MLP 16, 10 classes.
TINY = VitShape(
    image_size=32,
    patch_size=16,
    hidden_size=8,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=16,
    num_channels=3,
    num_labels=10,
)


def hf_parameter_count(shape: VitShape) -> int:
    config = ViTConfig(**{f.name: getattr(shape, f.name) for f in dataclasses.fields(shape)})
    with torch.device("meta"):
        model = ViTForImageClassification(config)
    return sum(p.numel() for p in model.parameters())


def test_parameter_count_by_hand_and_against_transformers():
    # cls 8 + positions 5 x 8 = 48; patch conv 3 x 16 x 16 x 8 + 8 = 6,152;
    # per layer q/k/v/o 4 x (64 + 8) = 288, two LayerNorms 32, fc1 8 x 16 + 16 = 144, fc2 16 x 8 + 8 = 136 -> 600;
    # final LayerNorm 16; classifier 8 x 10 + 10 = 90.
    assert TINY.num_parameters == 48 + 6152 + 2 * 600 + 16 + 90 == 7506
    assert TINY.layer_parameters == 600
    assert TINY.largest_module_parameters == 6152  # the patch convolution
    for shape in (TINY, vit_shape(MODEL_PRESETS["vit-b-16"]), vit_shape(MODEL_PRESETS["vit-ti-16"], 128, 8, 37)):
        assert shape.num_parameters == hf_parameter_count(shape)
    assert vit_shape(MODEL_PRESETS["vit-b-16"]).num_parameters == 86_567_656


def test_model_states_by_hand_per_engine():
    # Ψ = 7,506 on N = 2 ranks in bf16: shard = 3,753, p = 2.
    psi, shard = 7506, 3753
    expected = {
        "ddp": dict(parameters=4 * psi, gradients=4 * psi, optimizer_states=8 * psi, fp32_gradient_copy=0, host=0),
        "zero1": dict(
            parameters=2 * psi, gradients=2 * psi, optimizer_states=12 * shard, fp32_gradient_copy=4 * shard, host=0
        ),
        "zero2": dict(
            parameters=2 * psi, gradients=2 * shard, optimizer_states=12 * shard, fp32_gradient_copy=4 * shard, host=0
        ),
        # host: fp32 master 4 + moments 8 + fp32 gradients 4 + 16-bit staging copy 2, per shard element
        "zero2_offload": dict(
            parameters=2 * psi, gradients=0, optimizer_states=0, fp32_gradient_copy=0, host=18 * shard
        ),
        "zero3": dict(
            parameters=2 * shard,
            gradients=2 * shard,
            optimizer_states=12 * shard,
            fp32_gradient_copy=4 * shard,
            host=0,
        ),
        # host: 16-bit weights 2 + 16-bit gradients 2 + master 4 + moments 8 + fp32 gradients 4
        "zero3_offload": dict(parameters=0, gradients=0, optimizer_states=0, fp32_gradient_copy=0, host=20 * shard),
        "fsdp2": dict(
            parameters=4 * shard, gradients=4 * shard, optimizer_states=8 * shard, fp32_gradient_copy=0, host=0
        ),
    }
    assert set(expected) == set(ENGINES)
    for engine, states in expected.items():
        assert model_state_bytes(engine, psi, 2, "bf16") == states, engine
    # ZeRO's headline figure for mixed-precision Adam: 2Ψ + 2Ψ + 12Ψ = 16Ψ without sharding (N = 1).
    zero2 = model_state_bytes("zero2", psi, 1, "bf16")
    assert zero2["parameters"] + zero2["gradients"] + zero2["optimizer_states"] == 16 * psi
    # fp32 DeepSpeed still keeps a separate fp32 master partition (4 bytes) beside the 4-byte weights.
    assert model_state_bytes("zero3", psi, 2, "fp32")["parameters"] == 4 * shard
    assert model_state_bytes("zero3", psi, 2, "fp32")["optimizer_states"] == 12 * shard


def test_activation_bytes_by_hand():
    # fp32, batch 2: s = 5, b = 2, h = 8, I = 16, a = 2 -> sb = 10, sbh = 80, sbI = 160.
    # per layer: residual 2sbh + normed 2sbh + q,k,v 3sbh + attention output sbh + GELU in/out 2sbI
    #   = 160 + 160 + 240 + 80 + 320 = 960 elements x 4 B = 3,840 B; fp32 statistics (LayerNorm mean/rstd
    #   2 x 2sb + log-sum-exp asb) = 40 + 20 = 60 x 4 B = 240 B -> 4,080 B per layer.
    # pixels 2 x 3 x 32 x 32 x 4 B = 24,576; final LayerNorm input + output 2 x 80 x 4 = 640 and its statistics
    # 2 x 10 x 4 = 80, logits 2 x 10 x 4 = 80; backward working set (2sbI + 2sbh) x 4 = 1,920.
    act = activation_bytes(TINY, 2, "fp32")
    assert act["one_layer"] == 4080
    assert act["layers"] == 2 * 4080
    assert act["pixels"] == 24576
    assert act["embeddings_and_head"] == 24576 + 640 + 80 + 80
    assert act["backward_working_set"] == 1920
    assert act["total"] == 8160 + 24576 + 800 + 1920 == 35456
    # Checkpointing keeps each layer's input (L x sbh x 4 = 640 B) and recomputes one layer at a time.
    assert activation_bytes(TINY, 2, "fp32", gradient_checkpointing=True)["layers"] == 640 + 4080
    # Sequence parallelism over 2 ranks: ceil(5 / 2) = 3 tokens per rank inside the layers.
    assert activation_bytes(TINY, 2, "fp32", sequence_parallel_size=2)["one_layer"] == (
        (2 + 2 + 3 + 1) * 3 * 2 * 8 * 4 + 2 * 3 * 2 * 16 * 4 + (4 * 3 * 2 + 2 * 3 * 2) * 4
    )


def test_activation_formula_is_korthikanti_without_dropout_and_softmax():
    # With I = 4h and 2-byte activations the layer stores 32·sbh bytes: Korthikanti et al.'s sbh(34 + 5as/h)
    # without its two 1-byte dropout masks and the as² terms (fused attention, no dropout); only the fp32
    # statistics come on top.
    shape = vit_shape(MODEL_PRESETS["vit-b-16"])
    b, s, h, a = 4, shape.tokens, shape.hidden_size, shape.num_attention_heads
    layer = activation_bytes(shape, b, "bf16")["one_layer"]
    assert layer == (34 - 2) * s * b * h + (4 * s * b + a * s * b) * 4


def test_activation_bytes_match_a_real_forward_on_cpu():
    """What a 2-layer HF ViT keeps after its forward (SDPA, dropout 0), tracked with the profiler's allocation
    events, is the planner's activation total without the backward working set (within 1%)."""
    shape = dataclasses.replace(
        TINY, image_size=64, patch_size=8, hidden_size=64, num_attention_heads=4, intermediate_size=256
    )
    config = ViTConfig(**{f.name: getattr(shape, f.name) for f in dataclasses.fields(shape)})
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = ViTForImageClassification(config).train()
    batch = 8
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        pixels = torch.randn(batch, 3, 64, 64)
        logits = model(pixel_values=pixels).logits
    live = sum(e.nbytes() for e in prof.profiler.kineto_results.events() if e.nbytes() != 0)
    del logits
    predicted = activation_bytes(shape, batch, "fp32")
    expected = predicted["total"] - predicted["backward_working_set"]
    assert abs(live / expected - 1) < 0.01, (live, expected)


def test_zero3_keeps_models_under_the_reuse_distance_gathered():
    small = vit_shape(MODEL_PRESETS["vit-b-16"])
    assert zero3_gathered_parameters(small) == small.num_parameters
    huge = vit_shape(MODEL_PRESETS["vit-h-14"])  # 632 M parameters: 2 x (layers above) passes 1e9 for early layers
    kept = zero3_gathered_parameters(huge)
    assert 0.4e9 < kept < huge.num_parameters
    assert zero3_gathered_parameters(small, max_reuse_distance=0) == small.num_parameters - 12 * small.layer_parameters


def settings(**overrides) -> PlanSettings:
    values = dict(
        shape=vit_shape(MODEL_PRESETS["vit-b-16"]),
        per_device_batch=32,
        gpus_per_node=8,
        gpu_memory_bytes=40 * GiB,
        precision="bf16",
        ds_configs={},
    )
    values.update(overrides)
    return PlanSettings(**values)


def test_peak_is_static_plus_the_largest_phase():
    for engine in ENGINES:
        m = engine_memory(engine, settings())
        assert m.peak == m.phases["static"] + max(m.phases["forward"], m.phases["backward_end"], m.phases["step"])
        assert m.usable == 40 * GiB - int(0.1 * 40 * GiB)
        assert m.fits == (m.peak <= m.usable)


def test_largest_batch_is_the_boundary():
    for engine in ("ddp", "zero2", "zero3", "fsdp2"):
        base = settings(gpu_memory_bytes=16 * GiB)
        best = largest_batch(engine, base)
        assert best > 0
        assert engine_memory(engine, base.with_batch(best)).fits
        assert not engine_memory(engine, base.with_batch(best + 1)).fits
    # Nothing fits: a ViT-H in fp32 plain DDP needs 16Ψ ≈ 10 GB of model states + buckets before any activation.
    tiny_gpu = settings(shape=vit_shape(MODEL_PRESETS["vit-h-14"]), precision="fp32", gpu_memory_bytes=8 * GiB)
    assert largest_batch("ddp", tiny_gpu) == 0


def test_recommendation_prefers_ddp_when_it_fits():
    result = plan(settings())
    assert result.recommended == "ddp"
    assert "DDP fits" in result.reason
    # ZeRO-2 is estimated faster in bf16 (half the gradient bytes), yet DDP is recommended because it fits.
    speeds = {o.engine: o.speed.step_s for o in result.options}
    assert speeds["zero2"] < speeds["ddp"]


def test_recommendation_is_the_fastest_that_fits_when_ddp_does_not():
    # ViT-H/14 bf16 at 64 per GPU on 40 GB: DDP's 18Ψ + activations do not fit, sharded engines do.
    result = plan(settings(shape=vit_shape(MODEL_PRESETS["vit-h-14"]), per_device_batch=90))
    by_engine = {o.engine: o for o in result.options}
    assert not by_engine["ddp"].memory.fits
    fitting = [o for o in result.options if o.memory.fits]
    assert fitting
    assert result.recommended == min(fitting, key=lambda o: o.speed.step_s).engine
    assert "DDP needs" in result.reason


def test_recommendation_when_nothing_fits_suggests_the_largest_batch():
    result = plan(settings(shape=vit_shape(MODEL_PRESETS["vit-h-14"]), per_device_batch=4096))
    assert not any(o.memory.fits for o in result.options)
    best = max(o.max_batch for o in result.options)
    assert {o.engine: o.max_batch for o in result.options}[result.recommended] == best > 0
    assert "gradient_accumulation_steps" in result.reason
    engine, reason = recommend([])
    assert engine is None and "Nothing fits" in reason


def test_collective_volumes():
    psi = 1000
    # ring all-reduce of fp32 gradients over 4 ranks: 2 x 3/4 x 4,000 B
    assert collective_bytes_per_rank("ddp", psi, 4, "bf16") == 6000
    # ZeRO-2: reduce-scatter + all-gather of 2-byte values: 2 x 3/4 x 2,000 B
    assert collective_bytes_per_rank("zero2", psi, 4, "bf16") == 3000
    # ZeRO-3 / FSDP2: two all-gathers + one reduce-scatter: 3 x 3/4 x 2,000 B
    assert collective_bytes_per_rank("zero3", psi, 4, "bf16") == 4500
    assert collective_bytes_per_rank("fsdp2", psi, 4, "bf16") == 4500
    # DeepSpeed's ZeRO-3 does not gather again in backward what it kept gathered since forward.
    assert collective_bytes_per_rank("zero3", psi, 4, "bf16", regathered_parameters=0) == 3000
    assert collective_bytes_per_rank("ddp", psi, 1, "bf16") == 0


def test_speed_estimate_adds_compute_and_communication():
    s = settings(achievable_tflops=100.0, intra_node_gbps=50.0)
    speed = engine_speed("ddp", s)
    assert speed.seconds["compute"] == pytest.approx(32 * 6 * vit_forward_macs_per_image(s.shape) / 100e12)
    assert speed.seconds["collectives"] == pytest.approx(2 * 7 / 8 * 4 * 86_567_656 / 50e9)
    assert speed.step_s == pytest.approx(speed.seconds["compute"] + speed.seconds["collectives"])
    # Across nodes the slower link sets the pace; checkpointing adds one forward (x 4/3 compute).
    two_nodes = engine_speed("ddp", dataclasses.replace(s, nodes=2, inter_node_gbps=10.0))
    assert two_nodes.bandwidth_gbps == 10.0
    checkpointed = engine_speed("ddp", dataclasses.replace(s, gradient_checkpointing=True))
    assert checkpointed.seconds["compute"] == pytest.approx(speed.seconds["compute"] * 4 / 3)


def test_project_zero1_config_bucket_is_visible_in_the_plan():
    """A ds_config without reduce_bucket_size gets DeepSpeed's 5e8-element default bucket, allocated whole."""
    without = settings(per_device_batch=1, ds_configs={"zero1": {"zero_optimization": {"stage": 1}}})
    auto = settings(
        per_device_batch=1, ds_configs={"zero1": {"zero_optimization": {"stage": 1, "reduce_bucket_size": "auto"}}}
    )
    gap = engine_memory("zero1", without).peak - engine_memory("zero1", auto).peak
    assert gap > 0.5 * GiB  # 5e8 x 2 B = 0.93 GiB of bucket instead of h² x 2 B
    assert any("reduce_bucket_size" in note for note in engine_memory("zero1", without).notes)
