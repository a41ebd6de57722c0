"""Tests `planning.speed`: collective volumes and the step-time estimate."""

import dataclasses

import pytest

from hf_vit_scaling.models.flops import vit_forward_macs_per_image
from hf_vit_scaling.planning.speed import collective_bytes_per_rank, engine_speed
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
