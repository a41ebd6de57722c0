"""slurm/train.sbatch's decisions, run with bash without Slurm: `scontrol` and `srun` are stand-ins on PATH. srun
records the command every node would start and ends as the run would (finished, interrupted with
output_dir/interrupted.json, or failed); scontrol records a `requeue`. The job on a real local Slurm cluster,
signalled, requeued and resumed: tests/launched/test_slurm.py."""

import os
import shlex
import subprocess
import sys

import pytest

from tests.helpers.launchers import REPO

SCRIPT = REPO / "slurm" / "train.sbatch"
VARIABLES = ("RECIPE", "RECIPE_ARGS", "LAUNCHER", "PROCS_PER_NODE", "OUT", "MASTER_PORT", "MAX_RESTARTS", "PYTHON")

# srun: record the node command (its last argument), then end as SRUN_ENDS says.
SRUN = """#!/bin/bash
printf '%s' "${@: -1}" > "$CALLS/srun.cmd"
case $SRUN_ENDS in
  finished) exit 0 ;;
  interrupted) printf '{"signal": "SIGUSR1", "step": 40, "checkpoint": "%s/checkpoint-40"}' "$OUT" \
                 > "$OUT/interrupted.json"
               exit 1 ;;
  failed) exit 3 ;;
esac
"""
SCONTROL = """#!/bin/bash
if [ "$1" = show ]; then printf 'node0\\nnode1\\n'; else echo "$*" >> "$CALLS/scontrol.calls"; fi
"""


def run_script(tmp_path, ends: str = "finished", restart: int | None = None, **env) -> subprocess.CompletedProcess:
    fake, calls = tmp_path / "bin", tmp_path / "calls"
    fake.mkdir(exist_ok=True)
    calls.mkdir(exist_ok=True)
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        (fake / name).write_text(text)
        (fake / name).chmod(0o755)
    environ = {k: v for k, v in os.environ.items() if k not in VARIABLES and not k.startswith("SLURM_")}
    environ.update({"PATH": f"{fake}:{environ['PATH']}", "CALLS": str(calls), "SRUN_ENDS": ends, "SLURM_NNODES": "2",
                    "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node[0-1]", "SLURM_GPUS_PER_NODE": "4",
                    "PYTHON": sys.executable, "OUT": str(tmp_path / "out"), **env})  # fmt: skip
    if restart is not None:
        environ["SLURM_RESTART_COUNT"] = str(restart)
    return subprocess.run(["bash", str(SCRIPT)], cwd=REPO, capture_output=True, text=True, env=environ)


def node_command(tmp_path) -> list[str]:
    return shlex.split((tmp_path / "calls" / "srun.cmd").read_text().replace("$SLURM_NODEID", "1"))


def requeues(tmp_path) -> list[str]:
    calls = tmp_path / "calls" / "scontrol.calls"
    return calls.read_text().splitlines() if calls.exists() else []


def test_every_node_starts_torchrun_with_its_rank_usr1_ignored_and_resume_from_latest(tmp_path):
    proc = run_script(tmp_path, RECIPE_ARGS="recipes/medical_brain_mri/config.yaml --max_steps 9")
    assert proc.returncode == 0, proc.stderr
    words = node_command(tmp_path)
    assert words[:3] == ["trap", "", "USR1;"]  # the launcher ignores Slurm's warning; the ranks catch it
    launcher = words[words.index("exec") + 1 :]
    assert launcher[:3] == [sys.executable, "-m", "torch.distributed.run"]
    flags = dict(zip(launcher[3:13:2], launcher[4:13:2], strict=True))
    assert flags == {"--nnodes": "2", "--node_rank": "1", "--nproc_per_node": "4", "--master_addr": "node0",
                     "--master_port": "29500"}  # fmt: skip
    recipe = launcher[13:]
    assert recipe == ["recipes/train_vit.py", "recipes/medical_brain_mri/config.yaml", "--max_steps", "9",
                      "--output_dir", str(tmp_path / "out"), "--resume_from_checkpoint", "latest"]  # fmt: skip
    assert "finished:" in proc.stdout and requeues(tmp_path) == []  # a finished job is not requeued


def test_accelerate_gets_the_machine_rank_and_the_world(tmp_path):
    assert run_script(tmp_path, LAUNCHER="accelerate", PROCS_PER_NODE="2").returncode == 0
    words = node_command(tmp_path)
    launcher = words[words.index("exec") + 1 :]
    assert launcher[:3] == [sys.executable, "-m", "accelerate.commands.launch"]
    for flag, value in (("--num_machines", "2"), ("--machine_rank", "1"), ("--num_processes", "4"),
                        ("--main_process_ip", "node0")):  # fmt: skip
        assert launcher[launcher.index(flag) + 1] == value


def test_an_interrupted_run_is_requeued_until_the_limit(tmp_path):
    proc = run_script(tmp_path, "interrupted", restart=1)
    assert proc.returncode == 0, proc.stderr
    assert requeues(tmp_path) == ["requeue 77"]
    assert "interrupted by SIGUSR1 at step 40" in proc.stdout and "restart 2 of at most 3" in proc.stdout

    last = tmp_path / "last"
    last.mkdir()
    proc = run_script(last, "interrupted", restart=3)  # the third restart was the last one allowed
    assert proc.returncode == 1 and requeues(last) == []
    assert "error: interrupted by SIGUSR1 at step 40 (" in proc.stderr
    assert "has had its MAX_RESTARTS=3 restarts" in proc.stderr


def test_a_failed_run_is_not_requeued(tmp_path):
    proc = run_script(tmp_path, "failed")
    assert proc.returncode == 3 and requeues(tmp_path) == []
    assert "error: the run failed (exit 3) and is not requeued" in proc.stderr


def test_a_job_started_more_often_than_allowed_does_not_train(tmp_path):
    """Slurm also requeues on its own (preemption, a node failure): the start count stops a loop."""
    proc = run_script(tmp_path, restart=3, MAX_RESTARTS="2")
    assert proc.returncode == 1 and not (tmp_path / "calls" / "srun.cmd").exists()
    assert "error: job 77 was started 4 times, more than MAX_RESTARTS=2 restarts" in proc.stderr


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [("LAUNCHER", "mpirun", "LAUNCHER=mpirun is not torchrun or accelerate"),
     ("PROCS_PER_NODE", "0", "PROCS_PER_NODE=0 is not a whole number of at least 1"),
     ("MAX_RESTARTS", "many", "MAX_RESTARTS=many is not a whole number"),
     ("RECIPE", "recipes/nope.py", "RECIPE=recipes/nope.py is not a file")],
)  # fmt: skip
def test_bad_variables_stop_before_srun_with_one_error_line(tmp_path, variable, value, says):
    proc = run_script(tmp_path, **{variable: value})
    assert proc.returncode == 2 and not (tmp_path / "calls" / "srun.cmd").exists()
    assert [line for line in proc.stderr.splitlines() if line.startswith("error:")] == [
        next(line for line in proc.stderr.splitlines() if line.startswith(f"error: {says}"))
    ]


def test_cpu_nodes_get_one_process_each(tmp_path):
    proc = run_script(tmp_path, SLURM_GPUS_PER_NODE="0")
    assert proc.returncode == 0, proc.stderr
    words = node_command(tmp_path)
    assert words[words.index("--nproc_per_node") + 1] == "1"
