"""Every plain-Trainer load restores every tensor: the user's resume commands (plain Trainer, one process, and plain
DDP over 2 processes) end with exactly the uninterrupted run's model and losses, and a checkpoint missing a tensor
stops the resume with one `error:` line. (`--load_best_model_at_end` ending with exactly the best checkpoint's model
is checked for every engine, the plain Trainer included, in test_conformance.py.)

transformers 5 saves ViT weights in the original key format (`vit.encoder.layer.N.attention.attention.query`) and
converts them when loading with `from_pretrained`; the Trainer's own loads (resume, best model) did not, so every
encoder layer restarted from random weights with only a warning (`VitTrainer` now converts and loads strictly).

Schedule: constant learning rate, a checkpoint every 6 steps, 12 steps; the interrupted run stops at step 6.
"""

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_vit_scaling.training.checkpoints import mark_checkpoint_complete
from tests.helpers.launchers import (
    DS_CONFIGS,
    error_lines,
    losses_by_step,
    run_recipe,
    steps_trained_since,
    traced_lines,
)

STEPS, SAVE_EVERY = 12, 6
# The user's command (plain Trainer: no --ds_config), after TINY_ARGS (the later flag wins).
COMMON = (
    "--learning_rate 1e-3 --lr_scheduler_type constant --warmup_steps 0 --seed 7 --eval_strategy no "
    f"--save_strategy steps --save_steps {SAVE_EVERY} --logging_steps 1 --max_eval_samples 32 --trace_samples true"
).split()
RESUMED = list(range(SAVE_EVERY + 1, STEPS + 1))  # what a resume from checkpoint-6 trains, counted from the trace
MISSING_KEYS_WARNING = "There were missing keys"


def assert_same_model(reference_file, got_file) -> None:
    """Every tensor of `got_file` equals `reference_file`'s (atol 1e-6), and they hold the same keys."""
    ref, got = load_file(reference_file), load_file(got_file)
    assert sorted(got) == sorted(ref)
    differing = [key for key in ref if not torch.allclose(got[key], ref[key], rtol=0, atol=1e-6)]
    assert differing == [], f"{len(differing)}/{len(ref)} tensors differ, e.g. {differing[:3]}"


def assert_same_run(reference, resumed) -> None:
    """The resumed run ends with the uninterrupted run's model, and logs its losses at every step after the
    resume point."""
    assert_same_model(reference / "model.safetensors", resumed / "model.safetensors")
    ref, got = losses_by_step(reference), losses_by_step(resumed)
    after = list(range(SAVE_EVERY + 1, STEPS + 1))
    assert [got.get(step) for step in after] == pytest.approx([ref[step] for step in after], rel=0, abs=1e-6)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted")
    run_recipe(out, *COMMON, "--max_steps", str(STEPS))
    return out


def test_plain_trainer_resume_restores_every_tensor(uninterrupted, tmp_path):
    """The user's three commands: 12 steps; 6 steps; the same 12 steps resumed from checkpoint-6."""
    out = tmp_path / "b"
    run_recipe(out, *COMMON, "--max_steps", str(SAVE_EVERY))
    saved = load_file(out / "checkpoint-6" / "model.safetensors")
    assert any(".encoder.layer." in key for key in saved)  # transformers' original format, converted on load
    # Two runs with the same --seed start from the same weights and data (the recipe seeds before building the
    # model): the 6-step run's losses are the 12-step run's first 6, to the bit.
    first_six = list(range(1, SAVE_EVERY + 1))
    assert [losses_by_step(out)[s] for s in first_six] == [losses_by_step(uninterrupted)[s] for s in first_six]
    before = traced_lines(out)
    resumed = run_recipe(out, *COMMON, "--max_steps", str(STEPS), "--resume_from_checkpoint", out / "checkpoint-6")
    assert steps_trained_since(out, before) == {"rank0.jsonl": RESUMED}  # not a restart from step 1
    assert MISSING_KEYS_WARNING not in resumed.stderr + resumed.stdout
    assert_same_run(uninterrupted, out)


@pytest.mark.distributed
def test_plain_ddp_resume_from_latest_restores_every_tensor(engine_runs, tmp_path):
    """2 processes under plain DDP (torchrun), `--resume_from_checkpoint latest`, against the shared uninterrupted DDP
    run (`engine_runs`, its own schedule): its checkpoint-6 is what a run killed after step 6 leaves, so it is
    copied, not re-trained."""
    reference, _, args = engine_runs["ddp"]
    out = tmp_path / "b"
    out.mkdir()
    shutil.copytree(reference / "checkpoint-6", out / "checkpoint-6")
    resumed = run_recipe(out, *args, "--trace_samples", "true", "--resume_from_checkpoint", "latest",
                         launcher="torchrun", nproc=2)  # fmt: skip
    assert f"resuming from {out / 'checkpoint-6'}" in resumed.stdout
    assert steps_trained_since(out, {}) == {f"rank{r}.jsonl": RESUMED for r in (0, 1)}
    assert MISSING_KEYS_WARNING not in resumed.stderr + resumed.stdout
    assert_same_run(reference, out)


def test_a_checkpoint_missing_a_tensor_stops_the_resume_with_one_error_line(uninterrupted, tmp_path):
    out = tmp_path / "b"
    folder = out / "checkpoint-6"
    shutil.copytree(uninterrupted / "checkpoint-6", folder)
    tensors = load_file(folder / "model.safetensors")
    dropped = "vit.encoder.layer.1.output.dense.weight"
    del tensors[dropped]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    mark_checkpoint_complete(str(folder), SAVE_EVERY, 1, None)  # a complete checkpoint, short of one tensor
    proc = run_recipe(out, *COMMON, "--max_steps", str(STEPS), "--resume_from_checkpoint", folder, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = error_lines(proc.stderr)
    assert str(folder) in line and "vit.layers.1.mlp.fc2.weight" in line, line
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]  # the refusal, not a crash that also printed it
    assert not (out / "checkpoint-12").exists()


def test_a_zero2_checkpoint_resumed_without_its_engine_stops_with_one_error_line(uninterrupted, tmp_path):
    """The user's commands: 6 steps under ZeRO-2, then the resume without --ds_config. The AdamW moments are in
    global_step6/, which the plain Trainer does not read: it used to load the weights, start AdamW from zero and
    end "Done" without a word. The reverse (a plain checkpoint under ZeRO-2) is refused alike."""
    zero2 = ["--ds_config", str(DS_CONFIGS / "zero2.json")]
    out = tmp_path / "zero2"
    run_recipe(out, *COMMON, *zero2, "--max_steps", str(SAVE_EVERY))
    resumed = run_recipe(out, *COMMON, "--max_steps", str(STEPS), "--resume_from_checkpoint", "latest", check=False)
    assert resumed.returncode == 2, resumed.stderr[-3000:]
    (line,) = error_lines(resumed.stderr)
    assert "DeepSpeed ZeRO-2" in line and "plain Trainer" in line and str(out / "checkpoint-6") in line, line
    assert "Traceback" not in resumed.stderr, resumed.stderr[-3000:]
    assert not (out / "checkpoint-12").exists() and "Done" not in resumed.stdout

    plain = uninterrupted / "checkpoint-6"
    other = run_recipe(tmp_path / "other", *COMMON, *zero2, "--max_steps", str(STEPS), "--resume_from_checkpoint",
                       plain, check=False)  # fmt: skip
    assert other.returncode == 2, other.stderr[-3000:]
    (line,) = error_lines(other.stderr)
    assert "plain Trainer" in line.split("but this run")[0] and "ZeRO-2" in line.split("but this run")[1], line
    assert "Traceback" not in other.stderr, other.stderr[-3000:]
