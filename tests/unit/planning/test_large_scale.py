"""Tests the planner's terms for large runs: SwiGLU parameters and FLOPs, activation checkpointing (full and
selective) with SwiGLU, optimizer states sharded over hundreds of ranks (ZeRO, FSDP2, HSDP), the communication
terms of a step, fp16 and patch dropout. Each is worked out by hand from h, I, s, b, L, Ψ and N."""

import math

import pytest
import torch

from hf_vit_scaling.models.flops import layer_macs, vit_forward_macs_per_image
from hf_vit_scaling.planning.memory import engine_memory, model_state_bytes
from hf_vit_scaling.planning.plan import plan
from hf_vit_scaling.planning.presets import PLANNER_PRESETS
from hf_vit_scaling.planning.shapes import (
    HSDP,
    TokenStack,
    VitShape,
    bytes_per_element,
    stack_bytes,
    transformer_layer_sizes,
    vit_shape,
)
from hf_vit_scaling.planning.speed import collective_bytes_per_rank, communication_terms, engine_speed
from tests.unit.planning.plan_settings import settings

# A toy SwiGLU ViT small enough to count on paper: 32 px, patch 8 -> 16 patches + CLS = 17 tokens, h 8, I 12, 2 layers.
SWIGLU = VitShape(image_size=32, patch_size=8, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=12, num_labels=10, mlp="swiglu")  # fmt: skip


def test_swiglu_parameters_are_three_matrices_by_hand_and_as_torch_counts_them():
    """Fails if a SwiGLU layer is counted with GELU's two MLP matrices (2hI + I + h instead of 3hI + 2I + h)."""
    h, i = 8, 12
    attention = 4 * (h * h + h) + 4 * h  # q/k/v/o with biases + two LayerNorms
    assert SWIGLU.layer_parameters == attention + 3 * h * i + 2 * i + h == 640
    assert sum(sum(v) for v in transformer_layer_sizes("l", h, i, "swiglu").values()) == SWIGLU.layer_parameters
    # DINOv2's SwiGLUFFNFused: one Linear(h, 2I) (W1 and W2 fused) and one Linear(I, h), biases on.
    fused = torch.nn.Sequential(torch.nn.Linear(h, 2 * i), torch.nn.Linear(i, h))
    assert sum(p.numel() for p in fused.parameters()) == 3 * h * i + 2 * i + h
    # DINOv2's ViT-g/14: 40 such layers at h 1536, I 4096 + patch embedding and CLS: 1.14 B (its card: 1.1 B)
    dinov2 = vit_shape(PLANNER_PRESETS["dinov2-g-14"], num_labels=0)
    assert dinov2.layer_parameters == 4 * (1536**2 + 1536) + 4 * 1536 + 3 * 1536 * 4096 + 2 * 4096 + 1536
    assert 1.13e9 < dinov2.num_parameters < 1.15e9


def test_swiglu_flops_count_three_mlp_matrices():
    """Fails if the FLOP count ignores the SwiGLU's third matrix (2·N·h·I MLP MACs instead of 3·N·h·I)."""
    n, h, i = 17, 8, 12
    assert layer_macs(n, h, i, 3) - layer_macs(n, h, i) == n * h * i
    patch = 16 * 3 * 64 * 8
    assert vit_forward_macs_per_image(SWIGLU) == patch + 2 * (4 * n * h * h + 2 * n * n * h + 3 * n * h * i) + 8 * 10


def test_swiglu_checkpointing_keeps_layer_inputs_and_the_last_mlp_by_hand():
    """Fails if a checkpointed SwiGLU stack's transient MLP tensors are GELU's 2sbI instead of 4sbI (its W1|W2
    output, SiLU output and product), or if checkpointing keeps more than each layer's input."""
    b, s, h, i, layers = 3, 17, 8, 12, 2
    sbh, sbi = s * b * h, s * b * i
    stack = TokenStack.of(SWIGLU)
    full = stack_bytes(stack, b, "bf16")
    # a layer in bf16: 8sbh + 4sbI elements at 2 bytes + fp32 statistics (4sb + a·sb) at 4 bytes
    assert full["one_layer"] == (8 * sbh + 4 * sbi) * 2 + (4 * s * b + 2 * s * b) * 4
    assert full["kept"] == layers * full["one_layer"]
    checkpointed = stack_bytes(stack, b, "bf16", gradient_checkpointing=True)
    assert checkpointed["kept"] == layers * sbh * 2
    assert checkpointed["forward_transient"] == 4 * sbi * 2
    assert checkpointed["recomputed"] == full["one_layer"] - sbh * 2
    assert checkpointed["backward_working_set"] == (2 * sbi + sbh) * 2


def test_selective_checkpointing_saves_no_memory_beside_fused_attention_and_costs_the_attention_core():
    """Fails if selective recomputation changes the memory estimate (fused attention keeps no s x s matrix to drop)
    or does not add the attention core's forward, 4·s²·h FLOPs a layer and image (Korthikanti et al. 2022, §5)."""
    base = settings(shape=vit_shape(PLANNER_PRESETS["vit-g-14"]), per_device_batch=4, gpu_memory_bytes=80 * 2**30)
    selective = settings(**{**base.__dict__, "selective_checkpointing": True})
    for engine in ("ddp", "zero1", "fsdp2"):
        assert engine_memory(engine, selective).peak == engine_memory(engine, base).peak
    core = 4 * 257**2 * 1408 * 40 * 4  # 4 images
    extra = engine_speed("ddp", selective).seconds["compute"] - engine_speed("ddp", base).seconds["compute"]
    assert extra == pytest.approx(core / (base.achievable_tflops * 1e12))


@pytest.mark.parametrize("ranks", [8, 504, 1024])
def test_optimizer_states_shard_over_hundreds_of_ranks(ranks):
    """Fails if ZeRO's fp32 master weights and Adam moments (12 bytes a parameter, Rajbhandari et al. 2020) are not
    divided by the ranks, or if the 16-bit weights and gradients of ZeRO-1 are (only ZeRO-3 shards weights)."""
    psi = 1_011_000_000
    shard = math.ceil(psi / ranks)
    zero1 = model_state_bytes("zero1", psi, ranks, "fp16")
    assert zero1["optimizer_states"] == 12 * shard and zero1["parameters"] == zero1["gradients"] == 2 * psi
    zero3 = model_state_bytes("zero3", psi, ranks, "bf16")
    assert zero3["parameters"] == zero3["gradients"] == 2 * shard and zero3["optimizer_states"] == 12 * shard


def test_hsdp_shards_over_the_node_and_replicates_across_nodes():
    """Fails if HSDP shards its states over every rank (as FSDP2 does) instead of a node's GPUs: on 64 nodes of 8 its
    fp32 weights and moments are 12Ψ/8 per GPU, FSDP2's 12Ψ/512."""
    shape = vit_shape(PLANNER_PRESETS["vit-g-14"])
    s = settings(shape=shape, nodes=64, per_device_batch=16, gpu_memory_bytes=80 * 2**30)
    psi = shape.num_parameters
    hsdp, fsdp2 = engine_memory(HSDP, s), engine_memory("fsdp2", s)
    assert hsdp.parts["optimizer_states"] == 8 * math.ceil(psi / 8)
    assert fsdp2.parts["optimizer_states"] == 8 * math.ceil(psi / 512)
    # between steps the fp32 weights and moments (12 bytes); the 4-byte gradients live from backward to zero_grad
    assert hsdp.phases["static"] - fsdp2.phases["static"] == 12 * (math.ceil(psi / 8) - math.ceil(psi / 512))
    assert [o.engine for o in plan(s).options][-1] == HSDP  # planned on more than one node
    assert HSDP not in [o.engine for o in plan(settings(shape=shape)).options]  # on one node it is FSDP2


def test_communication_terms_per_step_by_hand():
    """Fails if a term's volume, link class or bandwidth is wrong: DDP's ring all-reduce of fp32 gradients
    (2(N-1)/N x 4Ψ) across nodes at the slower of NVLink and the network; HSDP's three in-node collectives
    ((g-1)/g x pΨ each, NVLink) and the replicas' all-reduce of the gradient shard (2(r-1)/r x pΨ/g) at the node's
    network bandwidth shared by its g GPUs."""
    shape = vit_shape(PLANNER_PRESETS["vit-g-14"])
    psi = shape.num_parameters
    s = settings(shape=shape, nodes=16, intra_node_gbps=230.0, inter_node_gbps=180.0)
    (ddp,) = communication_terms("ddp", s)
    assert (ddp.collective, ddp.link, ddp.gbps) == ("all-reduce", "ring across nodes", 180.0)
    assert ddp.bytes_per_rank == int(2 * 127 / 128 * 4 * psi)
    hsdp = communication_terms(HSDP, s)
    assert [(t.collective, t.link) for t in hsdp] == [("all-gather", "intra-node")] * 2 + [
        ("reduce-scatter", "intra-node"),
        ("all-reduce", "inter-node"),
    ]
    assert all(t.bytes_per_rank == int(7 / 8 * 2 * psi) and t.gbps == 230.0 for t in hsdp[:3])
    assert hsdp[3].bytes_per_rank == int(2 * 15 / 16 * 2 * math.ceil(psi / 8)) and hsdp[3].gbps == 180.0 / 8
    # The flat engines' terms add up to the volumes `collective_bytes_per_rank` states.
    for engine in ("ddp", "zero1", "zero2", "zero3", "fsdp2"):
        total = sum(t.bytes_per_rank for t in communication_terms(engine, s))
        assert total == pytest.approx(collective_bytes_per_rank(engine, psi, 128, "bf16"), abs=3)
    speed = engine_speed("ddp", s)
    assert speed.seconds["collectives"] == pytest.approx(ddp.bytes_per_rank / 180e9)


def test_fp16_is_planned_as_bf16_and_patch_dropout_keeps_half_the_patches():
    """Fails if fp16 is counted as 4-byte (fp32) or patch dropout does not shorten the sequence the layers see:
    EVA-CLIP's 0.5 keeps int(256 x 0.5) = 128 patches + CLS, while the position table keeps all 257."""
    assert bytes_per_element("fp16") == bytes_per_element("bf16") == 2
    s = settings(shape=vit_shape(PLANNER_PRESETS["vit-g-14"]), per_device_batch=8)
    assert (
        engine_memory("zero2", settings(**{**s.__dict__, "precision": "fp16"})).peak == engine_memory("zero2", s).peak
    )
    dropped = VitShape(**{**PLANNER_PRESETS["eva02-e-14"], "patch_dropout": 0.5})
    assert (dropped.tokens, dropped.all_tokens) == (129, 257)
    assert dropped.num_parameters == vit_shape(PLANNER_PRESETS["eva02-e-14"]).num_parameters
