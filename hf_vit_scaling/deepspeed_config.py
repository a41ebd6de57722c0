"""Reading and checking DeepSpeed JSON configs before any expensive work starts."""

import json
import os
from typing import Any

from .errors import UserInputError

ZERO_STAGES = (0, 1, 2, 3)


def load_ds_config(path: str, flag: str = "--ds_config") -> dict[str, Any]:
    """Load a DeepSpeed JSON config and check what we rely on: it is a JSON object with a known ZeRO stage."""
    if not os.path.isfile(path):
        raise UserInputError(
            f"{flag} {path!r}: no such file. Fix: pass one of the files in ds_configs/ (e.g. ds_configs/zero2.json)."
        )
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserInputError(f"{flag} {path!r} is not valid JSON ({err}). Fix the file or pick one in ds_configs/.") from err
    if not isinstance(config, dict):
        raise UserInputError(f"{flag} {path!r} must hold a JSON object (a dict of DeepSpeed keys), not {type(config).__name__}.")
    stage = config.get("zero_optimization", {}).get("stage", 0)
    if stage not in ZERO_STAGES:
        raise UserInputError(
            f"{flag} {path!r}: zero_optimization.stage is {stage!r}; DeepSpeed knows stages 0, 1, 2 and 3. Fix the stage."
        )
    return config


def zero_stage(config: dict[str, Any] | None) -> int | None:
    """ZeRO stage of a loaded config, or None when DeepSpeed is not used."""
    if config is None:
        return None
    return int(config.get("zero_optimization", {}).get("stage", 0))


def offload_targets(config: dict[str, Any] | None) -> dict[str, str]:
    """Which states a config offloads and where, e.g. {"optimizer": "cpu", "param": "cpu"}."""
    zero = (config or {}).get("zero_optimization", {})
    targets = {}
    for state in ("optimizer", "param"):
        device = zero.get(f"offload_{state}", {}).get("device", "none")
        if device not in (None, "none"):
            targets[state] = device
    return targets


def init_deepspeed_comm() -> None:
    """Make `deepspeed.comm` use the process group accelerate already started, before the model is built.

    On CPU (gloo) accelerate sets up torch.distributed but not deepspeed.comm; ZeRO-3 builds the model under
    `deepspeed.zero.Init`, which then sees a world size of 1 and rejects the batch sizes filled for the real world.
    """
    import deepspeed
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and not deepspeed.comm.is_initialized():
        deepspeed.init_distributed(dist_backend=dist.get_backend())


GLOO_WORKER_THREAD = "pt_gloo_runloop"  # the name torch gives ProcessGroupGloo's worker threads


def _busy_gloo_workers() -> list[str]:
    """Thread ids of gloo worker threads that are running or runnable (Linux /proc; [] where it is missing)."""
    busy = []
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return busy
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm", encoding="utf-8") as f:
                if f.read().strip() != GLOO_WORKER_THREAD:
                    continue
            with open(f"/proc/self/task/{tid}/stat", encoding="utf-8") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state == "R":
            busy.append(tid)
    return busy


def shutdown_distributed(drain_timeout_s: float = 10.0) -> None:
    """End-of-run teardown of torch.distributed; call on every rank once nothing communicates any more.

    Why: gloo runs each collective on a worker thread, which drops its reference to the finished work (and so to
    the tensors it was given) only after the caller was already woken. When the caller had dropped its own
    references first (accelerate's `gather_for_metrics` passes temporaries), that late release frees Python tensor
    objects and must take the GIL. If the interpreter is already finalizing by then, CPython ends the thread
    (pthread_exit) and the forced unwind through the C++ work destructor calls std::terminate: the process aborts
    with "terminate called without an active exception" after the run finished (issue 6).

    `destroy_process_group` alone does not prevent it: gloo's worker threads only stop when the C++ process group
    is destroyed, and DeepSpeed keeps its groups referenced (module globals, parameters, optimizer) until
    interpreter teardown. So: barrier (every rank done), destroy the groups, then release the GIL until no gloo
    worker thread is still running, i.e. every late release has happened while the interpreter is alive.
    """
    import time

    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    dist.barrier()
    dist.destroy_process_group()
    deadline = time.monotonic() + drain_timeout_s
    idle_checks = 0
    while time.monotonic() < deadline and idle_checks < 3:  # idle three checks in a row: nothing left to release
        time.sleep(0.005)  # releases the GIL: a worker that still has to free Python tensors gets it now
        idle_checks = 0 if _busy_gloo_workers() else idle_checks + 1
