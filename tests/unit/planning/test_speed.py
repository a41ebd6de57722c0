"""Tests `planning.speed`: collective volumes and the step-time estimate."""

import dataclasses

import pytest

from hf_vit_scaling.models.flops import vit_forward_macs_per_image
from hf_vit_scaling.planning.plan_arguments import parse_plan_flags
from hf_vit_scaling.planning.speed import (
    collective_bytes_per_rank,
    engine_speed,
    layer_non_gemm_elements,
    non_gemm_bytes_per_image,
)
from tests.unit.planning.plan_settings import settings


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


# ViT-B/16 at 224 px: s = 197 tokens, h = 768, I = 3,072, 12 layers; e = s·h, m = s·I elements.
E_B16, M_B16 = 197 * 768, 197 * 3072


def test_non_gemm_term_vit_b16_bf16_by_hand():
    """One A100 80GB, batch 1, bf16: a layer moves (10e + 2m) forward + (17e + 4m) backward elements of 2 bytes,
    7,716,096 x 12 x 2 = 185,186,304 bytes, at 2,039 GB/s; the GEMM term is unchanged and the step is their sum.

    Fails if the term is ignored (non_gemm 0), if the bytes are counted in fp32 under bf16 (4 bytes an element), or
    if the step leaves the term out."""
    s = settings(per_device_batch=1, gpus_per_node=1, achievable_tflops=124.8, hbm_gbps=2039.0)
    speed = engine_speed("ddp", s)
    by_hand = 12 * 2 * (27 * E_B16 + 6 * M_B16)
    assert by_hand == 185_186_304
    assert non_gemm_bytes_per_image(s.shape, "bf16") == by_hand
    assert speed.bytes["non_gemm"] == by_hand
    assert speed.seconds["non_gemm"] == pytest.approx(by_hand / 2039e9)  # 90.8 us
    assert speed.seconds["compute"] == pytest.approx(6 * vit_forward_macs_per_image(s.shape) / 124.8e12)  # 844 us
    assert speed.step_s == pytest.approx(speed.seconds["compute"] + speed.seconds["non_gemm"])
    assert speed.device_s == pytest.approx(speed.step_s) and speed.communication_s == pytest.approx(0.0)
    # fp32 moves 4 bytes an element: twice the bf16 bytes.
    assert non_gemm_bytes_per_image(s.shape, "fp32") == 2 * by_hand


def test_non_gemm_term_swiglu_checkpointing_and_sequence_parallel_by_hand():
    """SwiGLU: forward 10e + 3m (the product reads two halves), backward 17e + 7m (both halves' gradients, the fused
    W1|W2 bias gradient); full checkpointing reruns the forward kernels (+10e + 2m for GELU); Ulysses over 2 ranks
    halves the tokens each rank streams.

    Fails if SwiGLU is counted as GELU, if checkpointing's second forward is left out, or if sequence parallelism
    does not divide the bytes."""
    assert layer_non_gemm_elements(197, 768, 3072, "swiglu") == {"forward": 10 * E_B16 + 3 * M_B16,
                                                                  "backward": 17 * E_B16 + 7 * M_B16}  # fmt: skip
    s = settings(per_device_batch=4, gpus_per_node=1, hbm_gbps=1000.0)
    plain = 12 * 2 * (27 * E_B16 + 6 * M_B16)
    assert non_gemm_bytes_per_image(s.shape, "bf16", gradient_checkpointing=True) == plain + 12 * 2 * (
        10 * E_B16 + 2 * M_B16
    )
    checkpointed = engine_speed("ddp", dataclasses.replace(s, gradient_checkpointing=True))
    assert checkpointed.bytes["non_gemm"] == 4 * 12 * 2 * (37 * E_B16 + 8 * M_B16)
    halved = engine_speed("ddp", dataclasses.replace(s, gpus_per_node=2, sequence_parallel_size=2))
    assert halved.bytes["non_gemm"] == 4 * plain // 2


@pytest.mark.parametrize(
    ("flags", "gbps"),
    [
        (["--gpu_name", "A100", "--gpu_memory", "40GB"], 1555.0),
        (["--gpu_name", "A100", "--gpu_memory", "80GB"], 2039.0),
        (["--gpu_name", "H100", "--gpu_memory", "80GB"], 3350.0),
        (["--gpu_name", "H100", "--gpu_memory", "80GB", "--achievable_tflops", "300"], None),
    ],
)
def test_plan_flags_give_the_datasheet_hbm_bandwidth(flags, gbps):
    """recipes/plan.py's --gpu_name and --gpu_memory pick the datasheet bandwidth (A100 40GB and 80GB differ); a
    measured --achievable_tflops turns the term off, its epoch having spent that time already.

    Fails if the board's memory is ignored (A100 80GB planned at 40GB's 1,555 GB/s) or if the term stays on beside a
    measured TFLOP/s."""
    _, s = parse_plan_flags(flags, "ds_configs")
    assert s.hbm_gbps == gbps
    assert (engine_speed("ddp", s).seconds["non_gemm"] > 0) == (gbps is not None)


def test_zero3_on_one_gpu_gathers_nothing_as_the_recipe_resolves_it():
    """One process, weights on the GPU: the recipe keeps every tensor whole (persistence above the largest tensor), so
    the planner counts no gathers and ZeRO-3's step is ZeRO-2's; with several processes, offloaded weights or a
    threshold written in the file, the encoder layers and the 3 other modules are gathered twice a step."""
    from hf_vit_scaling.models.presets import MODEL_PRESETS
    from hf_vit_scaling.planning.shapes import read_ds_configs, vit_shape
    from hf_vit_scaling.planning.speed import zero3_gathers

    configs = read_ds_configs("ds_configs")
    one = settings(gpus_per_node=1, ds_configs=configs)
    assert zero3_gathers("zero3", one) == 0
    overhead = {engine: engine_speed(engine, one).seconds["engine_overhead"] for engine in ("zero2", "zero3")}
    assert overhead["zero3"] == overhead["zero2"] > 0
    assert zero3_gathers("zero3_offload", one) == 2 * (12 + 3)  # offload_param: the weights stay partitioned
    assert zero3_gathers("zero3", settings(gpus_per_node=2, ds_configs=configs)) == 2 * (12 + 3)
    # the tiny preset on 2 GPUs: every tensor (18,432 elements at most) under DeepSpeed's 1e5, all kept whole
    tiny = vit_shape(MODEL_PRESETS["vit-tiny-cpu"], image_size=16, num_labels=10)
    assert zero3_gathers("zero3", settings(shape=tiny, gpus_per_node=2, ds_configs=configs)) == 0
    written = {"zero3": {"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 1000}}}
    assert zero3_gathers("zero3", settings(gpus_per_node=1, ds_configs=written)) == 2 * (12 + 3)
    written["zero3"]["zero_optimization"]["leaf_module"] = {"classes": ["MyBlock"]}  # the user's own leaf: 8 a layer
    assert zero3_gathers("zero3", settings(gpus_per_node=1, ds_configs=written)) == 2 * (12 * 8 + 3)
