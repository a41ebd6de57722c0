"""Checkpoint completeness markers, `--resume_from_checkpoint latest`, and when a world-size change needs a
universal checkpoint."""

import json

import pytest

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.training.checkpoints import (
    checkpoint_problem,
    mark_checkpoint_complete,
    needs_universal_checkpoint,
    resolve_resume_checkpoint,
)


def _checkpoint(output_dir, step, complete=True, world_size=2):
    folder = output_dir / f"checkpoint-{step}"
    (folder / f"global_step{step}").mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"w" * 100)
    (folder / f"global_step{step}" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"o" * 50)
    (folder / "trainer_state.json").write_text("{}")
    if complete:
        mark_checkpoint_complete(str(folder), step, world_size, 2)
    return folder


def test_latest_skips_unmarked_and_truncated_checkpoints(tmp_path):
    _checkpoint(tmp_path, 4)
    _checkpoint(tmp_path, 8)
    truncated = _checkpoint(tmp_path, 12)
    (truncated / "model.safetensors").write_bytes(b"w" * 10)  # a later write cut it short
    _checkpoint(tmp_path, 16, complete=False)  # killed mid-save
    folder, notes = resolve_resume_checkpoint("latest", str(tmp_path))
    assert folder == str(tmp_path / "checkpoint-8")
    assert "checkpoint-16: no checkpoint_complete.json" in notes[0]
    assert "model.safetensors has 10 bytes, 100 were saved" in notes[1]
    assert notes[-1] == f"resuming from {tmp_path / 'checkpoint-8'}"


def test_latest_with_nothing_saved_starts_fresh(tmp_path):
    assert resolve_resume_checkpoint("latest", str(tmp_path / "new"))[0] is None


def test_explicit_incomplete_checkpoint_is_refused_naming_the_good_one(tmp_path):
    _checkpoint(tmp_path, 4)
    bad = _checkpoint(tmp_path, 8)
    (bad / "global_step8" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").unlink()
    with pytest.raises(UserInputError, match="zero_pp_rank_0_mp_rank_00_optim_states.pt is missing") as err:
        resolve_resume_checkpoint(str(bad), str(tmp_path))
    assert f"resume from {tmp_path / 'checkpoint-4'}" in str(err.value)


def test_world_size_change_needs_universal_only_for_partitioned_zero(tmp_path):
    folder = str(_checkpoint(tmp_path, 4, world_size=2))
    assert needs_universal_checkpoint(folder, world_size=1, zero_stage=2)
    assert not needs_universal_checkpoint(folder, world_size=2, zero_stage=2)
    assert not needs_universal_checkpoint(folder, world_size=1, zero_stage=0)  # ZeRO-0 saves the whole state
    assert not needs_universal_checkpoint(folder, world_size=1, zero_stage=None)


def test_marker_is_written_atomically_and_lists_sizes(tmp_path):
    folder = _checkpoint(tmp_path, 4)
    marker = json.loads((folder / "checkpoint_complete.json").read_text())
    assert marker["files"]["model.safetensors"] == 100 and marker["world_size"] == 2 and marker["step"] == 4
    assert not list(folder.glob("*.tmp-*"))
    assert checkpoint_problem(str(folder)) is None
