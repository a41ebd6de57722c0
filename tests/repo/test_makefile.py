"""`make train` starts one process per visible GPU (2 over gloo on a CPU): the Makefile's resolved command, read with
`make -n` (nothing runs), under a faked `nvidia-smi` on PATH."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def launch_line(tmp_path, gpus: int | None, **env) -> str:
    path = os.environ["PATH"]
    if gpus is not None:
        fake = tmp_path / "bin"
        fake.mkdir()
        listing = "".join(f'echo "GPU {i}: NVIDIA H200 (UUID: GPU-{i})"\n' for i in range(gpus))
        (fake / "nvidia-smi").write_text("#!/bin/sh\n" + listing)
        (fake / "nvidia-smi").chmod(0o755)
        path = f"{fake}:{path}"
    environ = {k: v for k, v in os.environ.items() if k not in ("NUM_PROCESSES", "CUDA_VISIBLE_DEVICES", "MAKEFLAGS")}
    proc = subprocess.run(["make", "-n", "train"], cwd=REPO, env={**environ, "PATH": path, **env},
                          capture_output=True, text=True, check=True)  # fmt: skip
    return next(line for line in proc.stdout.splitlines() if "accelerate launch" in line)


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize(
    ("gpus", "env", "expected"),
    [
        (1, {}, "launch  --num_processes 1 "),  # one GPU: no --multi_gpu (accelerate refuses it below 2)
        (4, {}, "launch --multi_gpu --num_processes 4 "),
        (8, {"CUDA_VISIBLE_DEVICES": "2,5"}, "launch --multi_gpu --num_processes 2 "),
    ],
)
def test_one_process_per_visible_gpu(tmp_path, gpus, env, expected):
    assert expected in launch_line(tmp_path, gpus, **env)


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a real nvidia-smi is on PATH")
def test_two_gloo_processes_without_a_gpu(tmp_path):
    assert "launch --multi_gpu --num_processes 2 " in launch_line(tmp_path, None)
