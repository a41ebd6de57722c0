"""Fault injection: real kills, restarts, changed process counts, failing saves, NaN losses, corrupt images, tokens.

Every case launches the recipe as real processes and checks that nothing was lost: the step reached, the data order
(each rank's per-step dataset rows, from --trace_samples), the loss, and the files. Faults come from
HF_VIT_SCALING_FAULTS (hf_vit_scaling/training/faults.py): a rank SIGKILLs itself, a file-size limit makes a save fail
part-way, a NaN enters the forward pass.

Schedule: 192 images / (2 processes x 16) = 6 steps per epoch; 14 steps; a checkpoint every 4 steps. The kill at
step 11 falls in epoch 2 (steps 7-12), 3 steps after checkpoint-8: the resumed run must skip the 2 batches of
epoch 2 it already trained on and train on the other 4.

One uninterrupted ZeRO-2 run is the reference of every kill: the engines train on the same rows and log the same
losses (tests/launched/test_fsdp.py holds each engine's loss at every step to plain DDP's within 1e-5).
"""

import os
import shutil

import pytest
from safetensors.torch import load_file

from hf_vit_scaling.training.checkpoints import checkpoint_problem
from tests.helpers.builders import make_image_folder
from tests.helpers.launchers import (
    BIN,
    DS_CONFIGS,
    RECIPE,
    TINY_ARGS,
    error_lines,
    free_port,
    fsdp_args,
    logged_losses,
    losses_by_step,
    read_json,
    run,
    run_recipe,
    sample_trace,
    steps_trained_since,
    traced_lines,
)

pytestmark = pytest.mark.distributed

STEPS, SAVE_EVERY, KILL_AT, IMAGES, BATCH = 14, 4, 11, 192, 16
AUGMENTATION = (
    "--random_resized_crop true --horizontal_flip true --rand_augment rand-m9-mstd0.5-inc1 --random_erasing 0.25 "
    "--mixup_alpha 0.8 --cutmix_alpha 1.0 --drop_path_rate 0.1"
).split()
EPOCH_2 = range(7, 13)
RESUMED = list(range(2 * SAVE_EVERY + 1, STEPS + 1))  # what a resume from checkpoint-8 trains: steps 9-14
SCHEDULE = [
    "--max_train_samples",
    str(IMAGES),
    "--max_eval_samples",
    "64",
    "--max_steps",
    str(STEPS),
    "--save_strategy",
    "steps",
    "--save_steps",
    str(SAVE_EVERY),
    "--logging_steps",
    "1",
    "--random_resized_crop",
    "false",
    "--trace_samples",
    "true",
]
# Every random transform on (device path: the digits are one size), so a resume must restore their draws too. Not on
# another number of processes: each rank draws from its own stream, which a changed world cannot continue.
AUGMENTED = [*SCHEDULE, *AUGMENTATION]
ZERO2 = ["--ds_config", str(DS_CONFIGS / "zero2.json")]
ZERO3 = ["--ds_config", str(DS_CONFIGS / "zero3.json")]
FSDP2_SHARDED = fsdp_args("fsdp2_sharded")  # per-rank checkpoint shards (torch.distributed.checkpoint)
FAULTS = "HF_VIT_SCALING_FAULTS"


def trace(output_dir) -> dict:
    """{(rank, step): rows} as trained on: a resumed run's entry for a step replaces the interrupted run's."""
    return {key: record["indices"] for key, record in sample_trace(output_dir).items()}


def rows_per_step(steps: dict) -> dict:
    """{step: rows of every rank together}."""
    merged = {}
    for (_, step), rows in steps.items():
        merged.setdefault(step, []).extend(rows)
    return merged


def assert_same_run(reference, resumed) -> None:
    """The resumed run ends at the same step, trained on the same rows at every step, saw every row of the
    interrupted epoch exactly once, and ends with the uninterrupted run's loss."""
    assert read_json(os.path.join(resumed, "trainer_state.json"))["global_step"] == STEPS
    ref_rows, got_rows = rows_per_step(trace(reference)), rows_per_step(trace(resumed))
    assert sorted(got_rows) == list(range(1, STEPS + 1))
    for step in got_rows:
        assert sorted(got_rows[step]) == sorted(ref_rows[step]), f"step {step} trained on other rows"
    epoch_rows = [row for step in EPOCH_2 for row in got_rows[step]]
    assert sorted(epoch_rows) == list(range(IMAGES))  # no repeats, no skips
    assert logged_losses(resumed)[-1] == pytest.approx(logged_losses(reference)[-1], rel=1e-4)


def assert_losses_from(reference, resumed, steps: list[int]) -> None:
    """The resumed run logged the reference's loss at every one of `steps` (1 and 2 processes sum in other orders:
    rel. 1e-4)."""
    expected, got = losses_by_step(reference), losses_by_step(resumed)
    assert [got.get(s) for s in steps] == pytest.approx([expected[s] for s in steps], rel=1e-4)


def reference_run(tmp_path_factory, name, *args, nproc=2, batch=BATCH, schedule=SCHEDULE):
    out = tmp_path_factory.mktemp(name)
    run_recipe(
        out,
        *args,
        *schedule,
        "--per_device_train_batch_size",
        str(batch),
        launcher="torchrun" if nproc > 1 else "python",
        nproc=nproc,
    )
    return out


@pytest.fixture(scope="module")
def ref_zero2(tmp_path_factory):
    """With every augmentation: the reference of ZeRO-2's and ZeRO-3's kills (the two draw alike)."""
    return reference_run(tmp_path_factory, "ref_zero2", *ZERO2, schedule=AUGMENTED)


@pytest.fixture(scope="module")
def ref_zero2_one_process(tmp_path_factory):
    """One process with the same global batch (1 x 32 = 2 x 16): the same rows per step as two processes."""
    return reference_run(tmp_path_factory, "ref_zero2_1p", *ZERO2, nproc=1, batch=2 * BATCH)


def test_zero2_sigkill_one_rank_then_resume_from_checkpoint(ref_zero2, tmp_path):
    out = tmp_path / "run"
    killed = run_recipe(
        out, *ZERO2, *AUGMENTED, launcher="torchrun", nproc=2, check=False, **{FAULTS: f"sigkill@{KILL_AT}:rank1"}
    )
    assert killed.returncode != 0 and "exitcode: -9" in killed.stderr  # torchrun saw rank 1 die of SIGKILL
    assert checkpoint_problem(out / "checkpoint-8") is None
    assert not (out / "checkpoint-12").exists()
    assert max(step for (rank, step) in trace(out) if rank == 1) == KILL_AT - 1

    before = traced_lines(out)
    resumed = run_recipe(
        out, *ZERO2, *AUGMENTED, "--resume_from_checkpoint", str(out / "checkpoint-8"), launcher="torchrun", nproc=2
    )
    assert f"resuming from {out / 'checkpoint-8'}" in resumed.stdout
    assert steps_trained_since(out, before) == {f"rank{r}.jsonl": RESUMED for r in (0, 1)}  # not from step 1
    assert_same_run(ref_zero2, out)


def test_zero3_torchrun_restarts_killed_job_from_latest_checkpoint(ref_zero2, tmp_path):
    out = tmp_path / "run"
    cmd = [
        BIN / "torchrun",
        "--nproc_per_node",
        "2",
        "--max-restarts",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{free_port()}",
        RECIPE,
        "--output_dir",
        out,
        *TINY_ARGS,
        *ZERO3,
        *AUGMENTED,
        "--resume_from_checkpoint",
        "latest",
    ]
    proc = run(cmd, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", **{FAULTS: f"sigkill@{KILL_AT}:rank1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "starting fresh" in proc.stdout  # first attempt: nothing to resume
    assert f"resuming from {out / 'checkpoint-8'}" in proc.stdout  # the restart, without a human
    for rank, steps in steps_trained_since(out, {}).items():  # both attempts: 1..k, then 9..14 (not 1..14 again)
        restart = steps.index(SAVE_EVERY * 2 + 1, SAVE_EVERY * 2 + 1)
        assert steps[:restart] == list(range(1, restart + 1)) and steps[restart:] == RESUMED, f"{rank}: {steps}"
    assert_same_run(ref_zero2, out)


# ZeRO 1-3 and both offloads resumed 2 -> 1 through the universal checkpoint, every step's loss and the weights
# compared: tests/launched/test_conformance.py.


def test_zero2_resume_one_process_on_two(ref_zero2_one_process, tmp_path):
    """checkpoint-8 of one process resumed on two: each rank trains steps 9-14 and no other, to the one-process
    run's loss at every one of them. Fails if the resume is a restart (--resume_from_checkpoint latest with the
    checkpoint deleted: steps 1-14 on the same rows give the same last loss)."""
    out = tmp_path / "run"
    out.mkdir()
    shutil.copytree(ref_zero2_one_process / "checkpoint-8", out / "checkpoint-8")
    proc = run_recipe(
        out, *ZERO2, *SCHEDULE, "--resume_from_checkpoint", str(out / "checkpoint-8"), launcher="torchrun", nproc=2
    )
    assert steps_trained_since(out, {}) == {f"rank{r}.jsonl": RESUMED for r in (0, 1)}  # not from step 1
    assert "saved by 1 process(es), this run has 2" in proc.stdout
    assert_losses_from(ref_zero2_one_process, out, RESUMED)


def test_failed_save_keeps_previous_checkpoint_and_resume_skips_the_partial_one(ref_zero2_one_process, tmp_path):
    """The save of checkpoint-8 fails part-way; `latest` skips it and resumes from checkpoint-4: the resumed process
    trains steps 5-14 and no other, to the uninterrupted run's loss at each. Fails if the resume is a restart (the
    checkpoints deleted before it: `latest` starts fresh and reaches the same last loss)."""
    out = tmp_path / "run"
    args = [*ZERO2, *SCHEDULE, "--per_device_train_batch_size", str(2 * BATCH)]
    failed = run_recipe(out, *args, check=False, **{FAULTS: "save_fail@8"})
    assert failed.returncode == 1
    message = error_lines(failed.stderr)
    assert len(message) == 1 and f"saving {out / 'checkpoint-8'} failed part-way" in message[0]
    assert f"{out / 'checkpoint-4'}, is intact" in message[0] and "--resume_from_checkpoint latest" in message[0]
    assert "Traceback" not in failed.stderr, failed.stderr[-3000:]
    assert checkpoint_problem(out / "checkpoint-4") is None
    assert "checkpoint_complete.json" in checkpoint_problem(out / "checkpoint-8")
    assert (out / "checkpoint-8" / "config.json").is_file()  # the save did start: it failed part-way

    before = traced_lines(out)
    resumed = run_recipe(out, *args, "--resume_from_checkpoint", "latest")
    after_checkpoint_4 = list(range(SAVE_EVERY + 1, STEPS + 1))
    assert steps_trained_since(out, before) == {"rank0.jsonl": after_checkpoint_4}  # not from step 1
    assert f"skipping {out / 'checkpoint-8'}" in resumed.stdout
    assert f"resuming from {out / 'checkpoint-4'}" in resumed.stdout
    assert_losses_from(ref_zero2_one_process, out, after_checkpoint_4)


def test_nan_loss_on_one_rank_stops_every_rank_with_one_message(tmp_path):
    out = tmp_path / "run"
    proc = run_recipe(
        out,
        *ZERO2,
        *SCHEDULE,
        "--max_steps",
        "8",
        launcher="torchrun",
        nproc=2,
        check=False,
        **{FAULTS: "nan@6:rank1"},
    )
    assert proc.returncode != 0
    errors = error_lines(proc.stderr)
    assert len(errors) == 1 and "non-finite training loss at step 6" in errors[0]
    assert f"Newest complete checkpoint: {out / 'checkpoint-4'}" in errors[0]
    # torchrun itself prints a traceback (ChildFailedError) when a rank exits 1; no rank's may pass the recipe
    assert 'train_vit.py", line' not in proc.stderr, proc.stderr[-3000:]
    assert checkpoint_problem(out / "checkpoint-4") is None
    assert max(step for (_, step) in trace(out)) == 6  # no rank went past the bad step


def test_nan_loss_skip_leaves_the_step_out_on_every_rank(tmp_path):
    out = tmp_path / "run"
    proc = run_recipe(
        out,
        *ZERO2,
        *SCHEDULE,
        "--max_steps",
        "8",
        "--on_nonfinite_loss",
        "skip",
        launcher="torchrun",
        nproc=2,
        **{FAULTS: "nan@6:rank1"},
    )
    assert proc.stdout.count("non-finite training loss at step 6") == 1
    assert read_json(out / "all_results.json")["train_nonfinite_steps_skipped"] == 1
    assert read_json(out / "trainer_state.json")["global_step"] == 8
    weights = load_file(out / "model.safetensors")
    assert all(bool(t.isfinite().all()) for t in weights.values())


DIGITS = 60  # real digits 0 and 1, as class folders "0" and "1"
CORRUPT, TRUNCATED = ("garbage.jpg",), ("truncated.png",)  # bad files in class "0"


def test_corrupt_images_are_skipped_counted_and_tokens_never_written(tmp_path):
    make_image_folder(tmp_path / "train", digits=DIGITS, corrupt=CORRUPT, truncated=TRUNCATED)
    make_image_folder(tmp_path / "val", digits=DIGITS)
    out = tmp_path / "run"
    secret = "hf_reliabilityTestToken0123456789"
    proc = run_recipe(
        out,
        "--train_dir",
        tmp_path / "train",
        "--validation_dir",
        tmp_path / "val",
        "--num_train_epochs",
        "1",
        "--save_strategy",
        "epoch",
        "--hub_token",
        secret,
        "--per_device_train_batch_size",
        "8",
        HF_TOKEN=secret + "_env",
    )
    skipped = read_json(out / "skipped_images.json")
    assert skipped["count"] == 2  # one epoch: each bad file met once
    assert sorted(os.path.basename(b["sample"].strip("'")) for b in skipped["images"]) == sorted(CORRUPT + TRUNCATED)
    assert read_json(out / "all_results.json")["train_skipped_images"] == 2
    assert "2 bad images skipped" in proc.stdout
    # The token: not in any file written (training_args.bin, checkpoints, reports, card) nor in the logs.
    for path in out.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), f"token found in {path}"
    assert secret not in proc.stdout + proc.stderr


def test_corrupt_image_with_fail_policy_stops_before_training_naming_it(tmp_path):
    make_image_folder(tmp_path / "train", digits=DIGITS, truncated=TRUNCATED)
    out = tmp_path / "run"
    proc = run_recipe(out, "--train_dir", tmp_path / "train", "--on_bad_image", "fail", check=False)
    assert proc.returncode == 2
    errors = error_lines(proc.stderr)
    assert len(errors) == 1 and "truncated.png" in errors[0] and "--on_bad_image skip" in errors[0]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("config", ["zero3_offload"])
def test_the_other_zero_configs_resume_exactly_with_every_augmentation(tmp_path, config):
    """The engine the kill tests above and test_conformance.py's resume matrix leave out (ZeRO-0, ZeRO-1 and ZeRO-2
    with offload resume exactly there; the augmentations' draws resume on ZeRO-2 and ZeRO-3 here): 14 steps with every
    augmentation, then checkpoint-8 resumed on the same 2 processes trains exactly steps 9-14 to the same losses."""
    engine = ["--ds_config", str(DS_CONFIGS / f"{config}.json")]
    reference, out = tmp_path / "reference", tmp_path / "run"
    run_recipe(reference, *engine, *AUGMENTED, launcher="torchrun", nproc=2)
    out.mkdir()
    shutil.copytree(reference / "checkpoint-8", out / "checkpoint-8")
    run_recipe(out, *engine, *AUGMENTED, "--resume_from_checkpoint", "latest", launcher="torchrun", nproc=2)
    assert steps_trained_since(out, {}) == {f"rank{r}.jsonl": RESUMED for r in (0, 1)}
    ref, got = sample_trace(reference), sample_trace(out)
    assert all(got[(r, s)]["pixels"] == ref[(r, s)]["pixels"] for r in (0, 1) for s in RESUMED)
    ref_losses, got_losses = losses_by_step(reference), losses_by_step(out)
    assert [got_losses[s] for s in RESUMED] == pytest.approx([ref_losses[s] for s in RESUMED], rel=1e-5)
