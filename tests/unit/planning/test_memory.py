"""Tests `planning.memory`: model states, peaks and the largest batch per engine, by hand."""

import math

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
        assert set(m.phases) == {"static", "forward", "backward_start", "backward_end", "step"}
        assert m.peak == m.phases["static"] + max(
            m.phases["forward"], m.phases["backward_start"], m.phases["backward_end"], m.phases["step"]
        )
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


def test_a_written_bucket_is_allocated_whole_and_auto_or_missing_is_sized_from_the_model():
    """A ds_config's written reduce_bucket_size (DeepSpeed's 5e8 default written out) is allocated whole and named
    in the notes; "auto" and a missing key are what the recipe resolves from the model's tensors (the same bytes)."""
    written_config = {"zero1": {"zero_optimization": {"stage": 1, "reduce_bucket_size": 5e8}}}
    written = settings(per_device_batch=1, ds_configs=written_config)
    auto = settings(
        per_device_batch=1, ds_configs={"zero1": {"zero_optimization": {"stage": 1, "reduce_bucket_size": "auto"}}}
    )
    missing = settings(per_device_batch=1, ds_configs={"zero1": {"zero_optimization": {"stage": 1}}})
    gap = engine_memory("zero1", written).peak - engine_memory("zero1", auto).peak
    assert gap > 0.5 * GiB  # 5e8 x 2 B = 0.93 GiB of bucket instead of the model-sized one
    assert any("reduce_bucket_size 500,000,000" in note for note in engine_memory("zero1", written).notes)
    assert engine_memory("zero1", missing).peak == engine_memory("zero1", auto).peak


# ViT-S/16 at 224 px with 10 classes on 2 ranks in bf16 (the measured configurations): s = 197 tokens, h = 384,
# MLP width I = 1536 (MLP), L = 12 layers, a = 6 heads, 3 x 224 x 224 pixels an image.
VIT_S = vit_shape(MODEL_PRESETS["vit-s-16"], num_labels=10)
S, H, MLP, L, A, PIXELS = 197, 384, 1536, 12, 6, 3 * 224 * 224
ZERO2_JSON = {"zero2": {"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto", "overlap_comm": True}}}


def vit_s_bf16(**overrides):
    return settings(**{"shape": VIT_S, "gpus_per_node": 2, "precision": "bf16", "ds_configs": ZERO2_JSON, **overrides})


def test_zero2_bf16_checkpointing_peaks_at_the_optimizer_step_by_hand():
    """ZeRO-2 in bf16 with checkpointing, batch 8: the peak is DeepSpeed's optimizer step, where the bf16 gradient
    partition, its flattened bf16 copy and the fp32 copy live at once (stage_1_and_2.py `step`). Measured on 2 CPU
    ranks: 21.0 + 20.6 + 41.2 MiB on top of what lives between steps; the planner left out the flattened copy
    (8.6% under)."""
    psi, shard = VIT_S.num_parameters, math.ceil(VIT_S.num_parameters / 2)
    static = 2 * psi + (4 + 8) * shard  # bf16 weights (whole) + fp32 master + Adam moments (this rank's half)
    # "auto" reduce_bucket_size on 2 ranks: ceil(Ψ / 3) + the largest tensor (h x I), to a multiple of 512
    # (parallel/deepspeed_config.gradient_bucket_elements); 2 buffers (overlap_comm), 2 B
    elements = -(-(-(-VIT_S.num_parameters // 3) + H * MLP) // 512) * 512
    bucket = elements * 2 * 2
    step = 2 * shard + bucket + 2 * shard + 4 * shard + 8 * PIXELS * 4  # + the step's fp32 input batch
    m = engine_memory("zero2", vit_s_bf16(per_device_batch=8, gradient_checkpointing=True))
    assert m.phases["static"] == static
    assert m.phases["step"] == step
    assert m.peak == static + step
    assert step == max(v for k, v in m.phases.items() if k != "static")


def test_fsdp2_bf16_peaks_at_the_end_of_forward_by_hand():
    """FSDP2 in bf16 (MixedPrecisionPolicy(param_dtype=bf16), as accelerate builds it for --bf16): every layer's
    activations at 2 B, unsharded bf16 weights (the root's and two layers), and the pixels 4 times through the
    forward pass: the fp32 batch, the root's bf16 cast, ViTModel's cast back to the fp32 shard's dtype, the patch
    embedding's bf16 cast (measured on 2 CPU ranks; the earlier planner counted one bf16 copy). ViT-S/32 (the
    ViT-S/16 preset with 32-pixel patches, 7 x 7 + 1 = 50 tokens), batch 16: few tokens per pixel, so the copies
    weigh: the earlier planner was 17 MiB (11%) under on this forward phase.
    (Issue 24's 26.6% under for FSDP2 bf16 came from the benchmark worker, which trained FSDP2 in fp32 whatever the
    precision; run as the recipe runs it, the earlier planner was within 2% on ViT-S/16 at 224 px, where the pixel
    copies and its too-large backward working set nearly cancel.)"""
    shape = vit_shape(MODEL_PRESETS["vit-s-16"], patch_size=32, num_labels=10)
    psi, shard, b, s = shape.num_parameters, math.ceil(shape.num_parameters / 2), 16, 50
    sbh, sbi, sb = s * b * H, s * b * MLP, s * b
    layer = (2 + 2 + 3 + 1) * sbh * 2 + 2 * sbi * 2 + (4 * sb + A * sb) * 4  # bf16 activations + fp32 statistics
    head = 2 * sbh * 2 + 2 * sb * 4 + b * 10 * 4  # final LayerNorm in/out, its statistics, the logits
    kept_pixels = b * PIXELS * (4 + 2)  # the fp32 batch and the convolution's bf16 copy: into backward
    forward_only_pixels = b * PIXELS * (2 + 4)  # the root's bf16 cast and ViTModel's fp32 cast: until forward returns
    weights = (psi - L * shape.layer_parameters + 2 * shape.layer_parameters) * 2
    static = 4 * shard + 8 * shard  # fp32 weight shard + Adam moments
    forward = L * layer + head + kept_pixels + forward_only_pixels + weights
    m = engine_memory("fsdp2", vit_s_bf16(shape=shape, per_device_batch=b))
    assert m.phases["static"] == static
    assert m.phases["forward"] == forward
    assert m.peak == static + forward
    # The backward through the top layer holds the same layers and kept pixels, and the working set (sbI + sbh) x 2
    # instead of the head and the forward-only copies: less.
    assert m.phases["backward_start"] == L * layer + kept_pixels + (sbi + sbh) * 2 + weights < forward
