"""Fault injection specs (HF_VIT_SCALING_FAULTS) and the faults themselves, in one process: the NaN forward hook and
the failing writes. The kill and the faults inside real runs are in tests/launched/test_reliability.py."""

import pytest
import torch

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.training.faults import (
    FAULTS_ENV,
    SAVE_FAIL_LIMIT_BYTES,
    Fault,
    FaultInjector,
    faults_from_env,
    parse_faults,
)
from tests.helpers.builders import save_tiny_pretrained_vit


def test_fault_specs_parse_and_reject_typos():
    assert parse_faults("sigkill@12:rank1, nan@7,save_fail@10") == [
        Fault("sigkill", 12, 1),
        Fault("nan", 7, None),
        Fault("save_fail", 10, None),
    ]
    assert Fault("nan", 7).hits("nan", 7, rank=3) and not Fault("nan", 7, 1).hits("nan", 7, rank=0)
    with pytest.raises(UserInputError, match="unknown fault 'sigint'"):
        parse_faults("sigint@3")
    with pytest.raises(UserInputError, match="KIND@STEP"):
        parse_faults("sigkill-12")


def test_faults_fire_in_the_first_attempt_only(monkeypatch):
    monkeypatch.setenv(FAULTS_ENV, "nan@3:rank0")
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    assert faults_from_env() == [Fault("nan", 3, 0)]
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # torchrun restarted the workers: the job runs clean
    assert faults_from_env() == []
    monkeypatch.delenv(FAULTS_ENV)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT")
    assert faults_from_env() == []


def test_nan_fault_poisons_one_forward_of_the_chosen_rank_and_step(tmp_path):
    model = save_tiny_pretrained_vit(tmp_path / "vit").eval()
    pixels, labels = torch.randn(2, 3, 16, 16), torch.tensor([0, 1])

    def loss() -> float:
        with torch.no_grad():
            return model(pixel_values=pixels, labels=labels).loss.item()

    faults = [Fault("nan", 7, 1)]
    FaultInjector(0, faults).before_training_step(model, 7)  # another rank: nothing armed
    FaultInjector(1, faults).before_training_step(model, 6)  # another step: nothing armed
    assert torch.isfinite(torch.tensor(loss()))
    assert not FaultInjector(1, []) and FaultInjector(1, faults)  # inactive unless the environment asks
    FaultInjector(1, faults).before_training_step(model, 7)
    assert torch.isnan(torch.tensor(loss()))
    assert torch.isfinite(torch.tensor(loss()))  # one-shot: the hook removed itself


def test_save_fault_fails_large_writes_inside_the_block_only(tmp_path):
    big = b"x" * (4 * SAVE_FAIL_LIMIT_BYTES)
    injector = FaultInjector(0, [Fault("save_fail", 8)])
    with injector.during_save(4):  # another step: writes succeed
        (tmp_path / "step4.bin").write_bytes(big)
    with pytest.raises(OSError), injector.during_save(8):
        (tmp_path / "step8.bin").write_bytes(big)
    assert (tmp_path / "step8.bin").stat().st_size <= SAVE_FAIL_LIMIT_BYTES  # cut off part-way
    (tmp_path / "after.bin").write_bytes(big)  # the limit is lifted again
    assert (tmp_path / "after.bin").stat().st_size == len(big)
