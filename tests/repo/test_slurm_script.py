"""slurm/scaling_study.sbatch's own arithmetic, run with bash without Slurm: `scontrol` and `srun` are stand-ins on
PATH, and `srun`'s command (the study runner every node starts) is read back. The job on a real local Slurm cluster:
tests/launched/test_slurm.py."""

import os
import re
import shlex
import subprocess

import pytest
from transformers import HfArgumentParser

from tests.helpers.launchers import REPO

SBATCH_SCRIPT = REPO / "slurm" / "scaling_study.sbatch"
VARIABLES = ("GPUS_PER_NODE", "OUT", "MASTER_PORT", "PYTHON", "STUDY_ARGS", "RECIPE_ARGS")

# Writes the command srun would start on every node: its last argument, the script of `bash -c`.
SRUN = """#!/bin/sh
eval "last=\\${$#}"
printf '%s' "$last" > "$SRUN_CMD"
"""


def run_sbatch_script(tmp_path, nodes: int, **env) -> subprocess.CompletedProcess:
    """Run the batch script as one Slurm task would; `srun` writes the command it would start (its last argument,
    `bash -c`'s script) to srun.cmd."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    # One write, as scontrol's: the script's `| head -n 1` under pipefail would fail on a writer cut off by SIGPIPE.
    hosts = "\\n".join(f"node{i}" for i in range(nodes))
    (fake / "scontrol").write_text(f"#!/bin/sh\nprintf '{hosts}\\n'\n")
    (fake / "srun").write_text(SRUN)
    for tool in ("scontrol", "srun"):
        (fake / tool).chmod(0o755)
    environ = {k: v for k, v in os.environ.items() if k not in VARIABLES and not k.startswith("SLURM_")}
    environ.update(PATH=f"{fake}:{environ['PATH']}", SRUN_CMD=str(tmp_path / "srun.cmd"), SLURM_NNODES=str(nodes),
                   SLURM_JOB_ID="77", SLURM_JOB_NODELIST=f"node[0-{nodes - 1}]", **env)  # fmt: skip
    return subprocess.run(["bash", str(SBATCH_SCRIPT)], cwd=REPO, capture_output=True, text=True, env=environ)


def study_arguments(tmp_path) -> list[str]:
    """The arguments each node passes to recipes/scaling_study.py (node rank 0), up to the recipe's `--`."""
    words = shlex.split((tmp_path / "srun.cmd").read_text().replace("$SLURM_NODEID", "0"))
    own = words[words.index("recipes/scaling_study.py") + 1 :]
    return own[: own.index("--")]


@pytest.mark.parametrize("nodes", [1, 2, 4])
@pytest.mark.parametrize(
    ("gpus_per_node", "expected"),
    [("1", [1]), ("2", [1, 2]), ("4", [1, 2, 4]), ("8", [1, 2, 4, 8]), (None, [1, 2, 4, 8])],
)
def test_default_grid_has_each_process_count_once(tmp_path, nodes, gpus_per_node, expected):
    env = {} if gpus_per_node is None else {"GPUS_PER_NODE": gpus_per_node}  # unset: the script's 8
    proc = run_sbatch_script(tmp_path, nodes, **env)
    assert proc.returncode == 0, proc.stderr
    own = study_arguments(tmp_path)
    assert own[own.index("--processes") + 1] == ",".join(map(str, expected))
    assert own[own.index("--nnodes") + 1] == str(nodes)
    from hf_vit_scaling.planning.study_runner import StudyArguments, build_grid

    (args,) = HfArgumentParser(StudyArguments).parse_args_into_dataclasses(own)
    grid = build_grid(args)
    assert [c["world"] for c in grid] == [n * nodes for n in expected]
    assert len({c["name"] for c in grid}) == len(grid)  # no cell twice: each has its own run folder


def test_a_count_that_is_no_power_of_two_ends_the_grid(tmp_path):
    # 6 GPUs per node: 1,2,4,6. (The default global batch, 2048, does not divide over 6: the study says so itself.)
    assert run_sbatch_script(tmp_path, 2, GPUS_PER_NODE="6").returncode == 0
    own = study_arguments(tmp_path)
    assert own[own.index("--processes") + 1] == "1,2,4,6"


@pytest.mark.parametrize("value", ["0", "four", "-2", "4,8"])
def test_a_bad_gpus_per_node_stops_with_an_error_line(tmp_path, value):
    proc = run_sbatch_script(tmp_path, 1, GPUS_PER_NODE=value)
    assert proc.returncode == 2 and not (tmp_path / "srun.cmd").exists()
    assert re.search(rf"^error: GPUS_PER_NODE={re.escape(value)} ", proc.stderr, re.MULTILINE), proc.stderr
    given = run_sbatch_script(tmp_path, 1, GPUS_PER_NODE=value, STUDY_ARGS="--study strong --processes 1")
    assert given.returncode == 0, given.stderr  # a grid of one's own: GPUS_PER_NODE is not read
    assert study_arguments(tmp_path)[:4] == ["--study", "strong", "--processes", "1"]
