"""The process world without a process group (multi-process behaviour is exercised by tests/launched/)."""

import pytest
import torch.distributed

from hf_vit_scaling.parallel.distributed import (
    ensure_single_process_env,
    gather_object,
    global_batch_size,
    is_main_process,
    rank_and_world,
)


def test_global_batch_counts_data_parallel_replicas():
    assert global_batch_size(16, 1, 2) == 32  # make train: 16 per device x 2 processes
    assert global_batch_size(64, 4, 8) == 2048
    assert global_batch_size(1, 1, 8, sequence_parallel_size=4) == 2  # 8 ranks = 2 groups sharing their images


def test_without_a_process_group_this_is_rank_0_of_1():
    assert rank_and_world() == (0, 1)
    assert gather_object({"images": 3}) == [{"images": 3}]


@pytest.mark.parametrize(("rank", "main"), [(None, True), ("0", True), ("1", False)])
def test_main_process_from_the_launcher_environment(monkeypatch, rank, main):
    # Before a process group exists (an in-process test elsewhere, e.g. one building TrainingArguments with a
    # ds_config, may have left a one-process group behind, which would make every rank 0 here).
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    if rank is None:
        monkeypatch.delenv("RANK", raising=False)
    else:
        monkeypatch.setenv("RANK", rank)
    assert is_main_process() is main


def test_single_process_env_only_without_a_launcher(monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "OMPI_COMM_WORLD_RANK", "PMI_RANK"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    assert ensure_single_process_env() is True
    import os

    assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) == ("0", "1") and int(os.environ["MASTER_PORT"]) > 0
    monkeypatch.setenv("RANK", "3")  # a launcher set it: leave its world alone
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert ensure_single_process_env() is False and os.environ["WORLD_SIZE"] == "4"
