"""What every benchmark script does with its result: print it, and write it as JSON when asked, with its provenance
(the command, the commit, the machine, the versions, the date), so a page's figure can name where it came from."""

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from hf_vit_scaling import utils

REPO = Path(__file__).resolve().parents[1]


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what `platform` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance(commit: str | None = None) -> dict:
    """Where a result comes from: command, commit (with "-dirty" for uncommitted changes; `commit` when what ran was
    another checkout, e.g. a fresh clone), CPU model and cores, GPU, versions, date (UTC)."""

    def git(*args) -> str:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else "unknown"

    versions = {}
    for name in ("torch", "transformers", "deepspeed", "accelerate"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            versions[name] = None
    import torch

    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {
        "command": " ".join(["python", os.path.relpath(sys.argv[0], REPO), *sys.argv[1:]]),
        "commit": commit or git("rev-parse", "--short", "HEAD") + ("-dirty" if dirty else ""),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "versions": versions,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }


def report_result(result: dict, output: str | None, commit: str | None = None) -> None:
    """Print `result`; with `output`, write it there as JSON with its `provenance` (`commit`: see there)."""
    print(json.dumps(result, indent=2))
    if output:
        result = {**result, "provenance": provenance(commit)}
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        with open(output, "w") as f:
            json.dump(result, f, indent=2)


def child_env(threads: int, checkout: Path = REPO) -> dict:
    """A benchmark's child process: `checkout`'s package (this one unless told), DeepSpeed's CPU accelerator,
    `threads` torch threads, never the Hub, and no launcher's rank variables (one process, no launcher)."""
    return utils.child_env(checkout, **utils.OFFLINE, DS_ACCELERATOR="cpu", OMP_NUM_THREADS=str(threads))
