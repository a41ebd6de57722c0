"""transformers' `--enable_jit_checkpoint` beside our `--stop_signals`: one behaviour on every launch, refused before
any step with one `error:` line naming --stop_signals, so no run ever has two SIGTERM handlers racing (theirs: a 3 s
timer and a save on each rank on its own; ours: the ranks agree on the step). One process, DDP through torchrun,
ZeRO-2 through accelerate, launched as tests/launched/test_interruption_launched.py launches them."""

import pytest

from tests.helpers.engine_runs import ENGINES
from tests.helpers.launchers import RECIPE, TINY_ARGS, error_lines, launcher_cmd, run

pytestmark = pytest.mark.distributed

LAUNCHES = {"one_process": ("python", 1, []), "ddp": (*ENGINES["ddp"][:1], 2, ENGINES["ddp"][1]),
            "zero2": (ENGINES["zero2"][0], 2, ENGINES["zero2"][1])}  # fmt: skip


@pytest.mark.parametrize("launch", LAUNCHES)
def test_jit_checkpoint_is_refused_on_every_launch_before_any_step(tmp_path, launch):
    """Fails if the refusal is removed (the run trains with both handlers installed: a checkpoint, a log) or is
    said by every rank instead of once."""
    launcher, nproc, engine_args = LAUNCHES[launch]
    out = tmp_path / "run"
    proc = run([*launcher_cmd(launcher, nproc), RECIPE, "--output_dir", out, *TINY_ARGS, *engine_args,
                "--max_steps", "4", "--save_strategy", "steps", "--save_steps", "2",
                "--enable_jit_checkpoint", "true", "--stop_signals", "SIGTERM"])  # fmt: skip
    detail = f"{proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    errors = error_lines(proc.stderr)
    assert len(errors) == 1 and "--enable_jit_checkpoint" in errors[0] and "--stop_signals" in errors[0], detail
    if launcher == "python":
        assert proc.returncode == 2, detail
    else:  # the launcher reports the workers' exit 2 as its own failure
        assert proc.returncode != 0 and "exitcode  : 2" in proc.stderr, detail
    assert not list(out.glob("checkpoint-*")) and not (out / "trainer_state.json").exists(), detail
