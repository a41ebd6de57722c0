"""Checkpoint completeness, `--resume_from_checkpoint latest`, fault specs, bad-image decoding, token handling."""

import io
import json
import os
import pickle

import numpy as np
import pytest
from PIL import Image

from hf_vit_scaling import UserInputError, checkpoint_problem, mark_checkpoint_complete, parse_args
from hf_vit_scaling.arguments import check_restart_setup
from hf_vit_scaling.checkpoints import needs_universal_checkpoint, resolve_resume_checkpoint
from hf_vit_scaling.data import drop_bad_examples, try_decode_image
from hf_vit_scaling.faults import Fault, parse_faults


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


def test_fault_specs_parse_and_reject_typos():
    assert parse_faults("sigkill@12:rank1, nan@7,save_fail@10") == [
        Fault("sigkill", 12, 1), Fault("nan", 7, None), Fault("save_fail", 10, None)]
    assert Fault("nan", 7).hits("nan", 7, rank=3) and not Fault("nan", 7, 1).hits("nan", 7, rank=0)
    with pytest.raises(UserInputError, match="unknown fault 'sigterm'"):
        parse_faults("sigterm@3")
    with pytest.raises(UserInputError, match="KIND@STEP"):
        parse_faults("sigkill-12")


def _png_bytes() -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.arange(64, dtype=np.uint8).reshape(8, 8)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_decoding_names_truncated_and_garbage_files():
    good = _png_bytes()
    image, reason = try_decode_image({"bytes": good, "path": None})
    assert reason is None and image.size == (8, 8)
    assert try_decode_image({"bytes": good[:40], "path": "cut.png"})[0] is None
    assert "UnidentifiedImageError" in try_decode_image({"bytes": b"not an image", "path": None})[1]


def test_collate_bookkeeping_drops_bad_rows_and_keeps_indices():
    examples = [
        {"pixel_values": 1, "labels": 0, "bad_image": None, "sample_index": 5},
        {"pixel_values": None, "labels": 1, "bad_image": {"sample": "(in memory)", "reason": "OSError: x"},
         "sample_index": 9},
        {"pixel_values": 2, "labels": 0, "bad_image": None, "sample_index": 7},
    ]
    good, extra = drop_bad_examples(examples)
    assert [e["sample_index"] for e in good] == [5, 7]
    assert extra["sample_index"].tolist() == [5, 7]
    assert extra["bad_samples"] == [{"sample": "row 9", "reason": "OSError: x"}]


def test_hub_token_never_stays_in_the_arguments(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    secret = "hf_unitTestToken42"
    *_, training_args = parse_args(["--output_dir", str(tmp_path), "--hub_token", secret])
    assert training_args.hub_token is None
    assert secret.encode() not in pickle.dumps(training_args)  # what training_args.bin holds
    assert os.environ["HF_TOKEN"] == secret  # where huggingface_hub finds it for the upload


def test_skip_policy_with_accumulation_is_refused(tmp_path):
    with pytest.raises(UserInputError, match="--gradient_accumulation_steps 1"):
        parse_args(["--output_dir", str(tmp_path), "--on_nonfinite_loss", "skip", "--gradient_accumulation_steps", "2"])


def test_torchrun_restarts_need_latest_and_a_fresh_store_per_attempt(tmp_path):
    """The environment torchrun gives its workers (printed from a real torchrun worker: TORCHELASTIC_USE_AGENT_STORE
    is True with the default static rendezvous and with c10d, False with c10d + TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)."""
    *_, training_args = parse_args(["--output_dir", str(tmp_path)])
    static = {"TORCHELASTIC_MAX_RESTARTS": "1", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    fresh_store = {"TORCHELASTIC_MAX_RESTARTS": "1", "TORCHELASTIC_USE_AGENT_STORE": "False"}
    with pytest.raises(UserInputError, match="--resume_from_checkpoint latest"):
        check_restart_setup(training_args, fresh_store)
    training_args.resume_from_checkpoint = "latest"
    with pytest.raises(UserInputError, match="TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --rdzv-backend c10d"):
        check_restart_setup(training_args, static)
    check_restart_setup(training_args, fresh_store)  # the launch the message recommends
    check_restart_setup(training_args, {"TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_USE_AGENT_STORE": "True"})
