"""Checkpoint completeness markers, `--resume_from_checkpoint latest`, and when a world-size change needs a
universal checkpoint."""

import json

import pytest

from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.training.checkpoints import (
    check_optimizer_state,
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


# The optimizer files each engine's checkpoint holds, as the Trainer writes them (seen in real checkpoints).
LAYOUTS = {
    ("deepspeed", 0): ["latest:global_step6", "global_step6/mp_rank_00_model_states.pt"],
    ("deepspeed", 2): ["latest:global_step6", "global_step6/mp_rank_00_model_states.pt",
                       "global_step6/zero_pp_rank_0_mp_rank_00_optim_states.pt"],
    ("deepspeed", 3): ["latest:global_step6", "global_step6/zero_pp_rank_0_mp_rank_00_model_states.pt",
                       "global_step6/zero_pp_rank_0_mp_rank_00_optim_states.pt"],
    ("fsdp", None): ["optimizer_0/__0_0.distcp"],
    ("trainer", None): ["optimizer.pt"],
}  # fmt: skip


def _saved_by(folder, layout: list[str], stage: int | None = None, marker: bool = True):
    for entry in ["model.safetensors", "scheduler.pt", "trainer_state.json", *layout]:
        name, _, text = entry.partition(":")
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text or "x")
    if marker:
        mark_checkpoint_complete(str(folder), 6, 1, stage)
    return str(folder)


@pytest.mark.parametrize("marker", [True, False])
@pytest.mark.parametrize("saved", list(LAYOUTS))
def test_a_checkpoint_resumes_only_with_the_engine_that_holds_its_optimizer_state(tmp_path, saved, marker):
    folder = _saved_by(tmp_path, LAYOUTS[saved], saved[1], marker)
    for asked in LAYOUTS:
        if asked == saved:
            check_optimizer_state(folder, *asked)
            continue
        with pytest.raises(UserInputError) as err:
            check_optimizer_state(folder, *asked)
        message = str(err.value)
        assert folder in message and "Fix:" in message
        words = {"fsdp": "FSDP2", "trainer": "plain Trainer"}.get(saved[0], f"ZeRO-{saved[1]}")
        if saved == ("deepspeed", 2) and not marker:
            words = "ZeRO-1 or 2"  # the files of ZeRO-1 and 2 look alike; only the marker says which
        assert words in message.split("but this run")[0]


def test_zero2_offload_loads_a_zero2_checkpoint(tmp_path):
    """Offloading moves the states in memory, not the files' layout: the same stage is the same checkpoint."""
    check_optimizer_state(_saved_by(tmp_path, LAYOUTS[("deepspeed", 2)], 2), "deepspeed", 2)


def test_a_checkpoint_without_optimizer_state_is_refused(tmp_path):
    """--save_only_model: weights, schedule and state, no moments."""
    folder = _saved_by(tmp_path, [])
    with pytest.raises(UserInputError, match="holds no optimizer state .*--save_only_model"):
        check_optimizer_state(folder, "trainer", None)
