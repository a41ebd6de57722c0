"""Tests `planning.memory`: model states, peaks and the largest batch per engine, by hand."""

from hf_vit_scaling.models.presets import MODEL_PRESETS
from hf_vit_scaling.planning.memory import (
    engine_memory,
    largest_batch,
    model_state_bytes,
    zero3_gathered_parameters,
)
from hf_vit_scaling.planning.shapes import ENGINES, GiB, vit_shape
from tests.unit.planning.plan_settings import settings


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


def test_zero3_keeps_models_under_the_reuse_distance_gathered():
    small = vit_shape(MODEL_PRESETS["vit-b-16"])
    assert zero3_gathered_parameters(small) == small.num_parameters
    huge = vit_shape(MODEL_PRESETS["vit-h-14"])  # 632 M parameters: 2 x (layers above) passes 1e9 for early layers
    kept = zero3_gathered_parameters(huge)
    assert 0.4e9 < kept < huge.num_parameters
    assert zero3_gathered_parameters(small, max_reuse_distance=0) == small.num_parameters - 12 * small.layer_parameters


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


def test_project_zero1_config_bucket_is_visible_in_the_plan():
    """A ds_config without reduce_bucket_size gets DeepSpeed's 5e8-element default bucket, allocated whole."""
    without = settings(per_device_batch=1, ds_configs={"zero1": {"zero_optimization": {"stage": 1}}})
    auto = settings(
        per_device_batch=1, ds_configs={"zero1": {"zero_optimization": {"stage": 1, "reduce_bucket_size": "auto"}}}
    )
    gap = engine_memory("zero1", without).peak - engine_memory("zero1", auto).peak
    assert gap > 0.5 * GiB  # 5e8 x 2 B = 0.93 GiB of bucket instead of h² x 2 B
    assert any("reduce_bucket_size" in note for note in engine_memory("zero1", without).notes)
