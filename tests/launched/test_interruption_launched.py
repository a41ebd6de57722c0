"""SIGTERM to a one-process run and to torchrun: the run stops at a step boundary with a complete checkpoint, writes
output_dir/interrupted.json, says `interrupted by SIGTERM at step N`, and the same command with
`--resume_from_checkpoint latest` trains the remaining steps to the uninterrupted run's losses and weights, and only
those: every rank of the resumed process traces the steps after the stop and no other (`--trace_samples`). A resume
that silently restarted from step 1 logs the same losses and ends with the same weights; the trace fails it (shown
with the checkpoints deleted before the resumed run, so `latest` starts fresh).

The reference is DDP's run of tests/helpers/engine_runs.py (2 x 16 images, 12 steps, a checkpoint every 3); the
signal comes as step 5 starts, off that schedule, so checkpoint-5 exists only because the stop saved it. The signal
is sent by the run itself (`HF_VIT_SCALING_FAULTS`: `sigterm@5` to itself, `sigterm_launcher@5` to torchrun, which
forwards SIGTERM to every worker), so it arrives at a known step. Every engine: tests/launched/test_conformance.py;
under Slurm: tests/launched/test_slurm.py."""

import shutil
from pathlib import Path

import pytest

from hf_vit_scaling.training.checkpoints import checkpoint_problem
from tests.helpers.engine_runs import ENGINE_RUN_ARGS, ENGINE_STEPS, ENGINES
from tests.helpers.launchers import (
    RECIPE,
    TINY_ARGS,
    launcher_cmd,
    losses_by_step,
    read_json,
    run,
    steps_trained_since,
    traced_lines,
)
from tests.launched.test_conformance import checkpoint_weights, first_difference, moments_difference, optimizer_moments

pytestmark = pytest.mark.distributed

FAULTS = "HF_VIT_SCALING_FAULTS"
STOP_AT = 5


def recipe(out, launcher: str, nproc: int, *extra, **env):
    batch = str(32 // nproc)  # the reference's global batch of 32 on 1 or 2 processes
    cmd = [*launcher_cmd(launcher, nproc), RECIPE, "--output_dir", out, *TINY_ARGS, *ENGINE_RUN_ARGS,
           "--per_device_train_batch_size", batch, "--trace_samples", "true", *extra]  # fmt: skip
    return run(cmd, **env)


def assert_stopped_then_resumed_exactly(reference, out, launcher: str, nproc: int, fault: str) -> int:
    """Run with `fault`, check the stop, resume with `latest`, compare with `reference`; returns the stop step."""
    stopped = recipe(out, launcher, nproc, **{FAULTS: fault})
    record = read_json(out / "interrupted.json")
    step = record["step"]
    detail = f"{stopped.returncode}\n{stopped.stdout[-2000:]}\n{stopped.stderr[-3000:]}"
    assert (record["signal"], record["complete"]) == ("SIGTERM", True), detail
    assert f"interrupted by SIGTERM at step {step}: saved {out / f'checkpoint-{step}'}" in stopped.stdout, detail
    assert checkpoint_problem(out / f"checkpoint-{step}") is None
    assert {p.name for p in out.glob("checkpoint-*")} == {f"checkpoint-{s}" for s in (*range(3, step, 3), step)}
    if launcher == "python":
        assert stopped.returncode == 75, detail  # "interrupted: run again" (torchrun reports its own failure)
    assert not any(s > step for trace in steps_trained_since(out, {}).values() for s in trace)

    before = traced_lines(out)
    resumed = recipe(out, launcher, nproc, "--resume_from_checkpoint", "latest")
    assert resumed.returncode == 0, f"{resumed.stdout[-2000:]}\n{resumed.stderr[-3000:]}"
    remaining = list(range(step + 1, ENGINE_STEPS + 1))
    assert steps_trained_since(out, before) == {f"rank{r}.jsonl": remaining for r in range(nproc)}, "not a resume"
    assert f"resuming from {out / f'checkpoint-{step}'}" in resumed.stdout
    expected, got = losses_by_step(reference), losses_by_step(out)
    for s in range(step + 1, ENGINE_STEPS + 1):
        assert got[s] == pytest.approx(expected[s], rel=1e-5, abs=0), f"step {s}: {got[s]} != {expected[s]}"
    # The reference is DDP on 2 processes. One process averages the same gradients in another order: on an AMD EPYC
    # its final weights differ from DDP's by up to 4.73e-06 with transformers 5.24 / accelerate 1.15, and by 2.82e-05
    # (vit.layers.0.attention.v_proj.weight) with transformers 5.25 / accelerate 1.16, on the commit before this
    # tolerance as on this one (near-zero weights, where rtol gives nothing), with or without a stop; a restart
    # instead of a resume fails the steps check above.
    atol = 1e-6 if nproc == 2 else 5e-5
    differs = first_difference(checkpoint_weights(reference, reference), checkpoint_weights(out, reference),
                               rtol=1e-4, atol=atol)  # fmt: skip
    assert differs is None, f"final weights differ at {differs}"
    return step


def test_one_process_saves_on_sigterm_exits_75_and_resumes_exactly(engine_runs, tmp_path):
    reference, _, _ = engine_runs["ddp"]
    step = assert_stopped_then_resumed_exactly(reference, tmp_path / "run", "python", 1, f"sigterm@{STOP_AT}")
    assert step == STOP_AT  # one process needs no agreement: step 5 is the last; off the schedule of saves (every
    # 3), so checkpoint-5 is the stop's own


def test_torchrun_forwards_sigterm_and_every_rank_stops_at_the_same_step(engine_runs, tmp_path):
    """torchrun's SIGTERM reaches its workers one after the other, a step or so apart on this machine: they agree
    on one step, one after the first saw it (one checkpoint, every rank's trace ending there)."""
    reference, _, _ = engine_runs["ddp"]
    out = tmp_path / "run"
    step = assert_stopped_then_resumed_exactly(reference, out, "torchrun", 2, f"sigterm_launcher@{STOP_AT}:rank0")
    assert STOP_AT < step < ENGINE_STEPS


@pytest.mark.parametrize("engine", ["zero3", "fsdp2_sharded"])
def test_one_rank_signalled_every_rank_saves_the_step_the_uninterrupted_run_saved(engine_runs, tmp_path, engine):
    """Only rank 1 gets SIGTERM (as step 5 starts); the ranks agree a step later and both stop after step 6, whose
    checkpoint holds what the uninterrupted run's checkpoint-6 holds: the same weights and AdamW moments (so a resume
    from it is the conformance matrix's, tests/launched/test_conformance.py). DDP, ZeRO-2, one process: above and
    under Slurm (tests/launched/test_slurm.py)."""
    reference, _, args = engine_runs[engine]
    out = tmp_path / "run"
    launcher = ENGINES[engine][0]
    stopped = run([*launcher_cmd(launcher, 2), RECIPE, "--output_dir", out, *TINY_ARGS, *args],
                  **{FAULTS: "sigterm@5:rank1"})  # fmt: skip
    detail = f"{stopped.returncode}\n{stopped.stdout[-2000:]}\n{stopped.stderr[-3000:]}"
    assert stopped.returncode != 0 and "exitcode  : 75" in stopped.stderr, detail  # the launcher saw exit 75
    record = read_json(out / "interrupted.json")
    assert (record["signal"], record["step"], record["complete"]) == ("SIGTERM", 6, True), detail
    assert read_json(out / "checkpoint-6" / "trainer_state.json")["global_step"] == 6
    assert not (out / "checkpoint-9").exists()
    # A copy: reading moments converts (universal checkpoint, DCP made whole) next to the files, and the reference
    # folder is shared with the other pytest-xdist worker (tests/helpers/engine_runs.py).
    folder = out / "checkpoint-6"
    expected = Path(shutil.copytree(reference / "checkpoint-6", tmp_path / "reference-6"))
    differs = first_difference(checkpoint_weights(expected, reference), checkpoint_weights(folder, reference),
                               rtol=0, atol=0, across_runs=False)  # fmt: skip
    assert differs is None, f"{engine}: checkpoint-6's weights differ at {differs}"
    moments = moments_difference(optimizer_moments(expected, engine), optimizer_moments(folder, engine), rtol=0)
    assert moments is None, f"{engine}: checkpoint-6's optimizer state differs at {moments}"
