"""What every benchmark script does with its result: print it, and write it as JSON when asked."""

import json
import os
from pathlib import Path

from hf_vit_scaling import utils

REPO = Path(__file__).resolve().parents[1]


def report_result(result: dict, output: str | None) -> None:
    print(json.dumps(result, indent=2))
    if output:
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        with open(output, "w") as f:
            json.dump(result, f, indent=2)


def child_env(threads: int) -> dict:
    """A benchmark's child process: this checkout's package, DeepSpeed's CPU accelerator, `threads` torch threads,
    never the Hub, and no launcher's rank variables (one process, no launcher)."""
    return utils.child_env(REPO, **utils.OFFLINE, DS_ACCELERATOR="cpu", OMP_NUM_THREADS=str(threads))
