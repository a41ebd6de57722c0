"""The process world: who am I, how many are we, and the few collectives and arithmetic every feature shares.

One home for what was asked in many ways: rank and world size (with or without a process group), the global batch
formula, `gather_object`, starting DeepSpeed's communication on the group accelerate built, the one-process world
for launcher-less runs, and the end-of-run shutdown that keeps gloo from aborting at exit.
"""

import os
import time

import torch.distributed as dist
from torch.distributed.elastic.utils.distributed import get_free_port

# Rank 0 is answered by the logger (it asks first, and imports nothing from the package); offered here with the rest.
from hf_vit_scaling.log import is_main_process as is_main_process

LAUNCHER_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
GLOO_WORKER_THREAD = "pt_gloo_runloop"  # the name torch gives ProcessGroupGloo's worker threads


def is_initialized() -> bool:
    """True when a torch.distributed process group exists."""
    return dist.is_available() and dist.is_initialized()


def is_multi_process() -> bool:
    """True when a process group with more than one rank exists (collectives are needed)."""
    return is_initialized() and dist.get_world_size() > 1


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of the process group, (0, 1) without one."""
    if is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def global_batch_size(per_device: int, accumulation: int, world_size: int, sequence_parallel_size: int = 1) -> int:
    """Images per optimizer step. The N ranks of one sequence-parallel group share their images, so the replicas are
    world / N: e.g. 16 per device x 1 accumulation x 2 processes = 32; 1 x 1 x (8 / 4) = 2 with N = 4."""
    return per_device * accumulation * (world_size // sequence_parallel_size)


def gather_object(obj) -> list:
    """Every rank's `obj`, in rank order (a collective: call on all ranks); [obj] without a process group."""
    if not is_multi_process():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def ensure_single_process_env() -> bool:
    """Make `python recipe.py --ds_config ...` work without a launcher.

    With no launcher, DeepSpeed falls back to MPI discovery and fails (`No module named 'mpi4py'`). We declare a
    one-process world the way torchrun would. Returns True when the variables were set.
    """
    if any(name in os.environ for name in LAUNCHER_ENV):
        return False
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(get_free_port()))
    return True


def init_deepspeed_comm() -> None:
    """Make `deepspeed.comm` use the process group accelerate already started, before the model is built.

    On CPU (gloo) accelerate sets up torch.distributed but not deepspeed.comm; ZeRO-3 builds the model under
    `deepspeed.zero.Init`, which then sees a world size of 1 and rejects the batch sizes filled for the real world.
    """
    import deepspeed

    if not deepspeed.comm.is_initialized():
        deepspeed.init_distributed(dist_backend=dist.get_backend() if is_initialized() else None)


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
    with "terminate called without an active exception" after the run finished.

    `destroy_process_group` alone does not prevent it: gloo's worker threads only stop when the C++ process group
    is destroyed, and DeepSpeed keeps its groups referenced (module globals, parameters, optimizer) until
    interpreter teardown. So: barrier (every rank done), destroy the groups, then release the GIL until no gloo
    worker thread is still running, i.e. every late release has happened while the interpreter is alive.
    """
    if not is_initialized():
        return
    dist.barrier()
    dist.destroy_process_group()
    deadline = time.monotonic() + drain_timeout_s
    idle_checks = 0
    while time.monotonic() < deadline and idle_checks < 3:  # idle three checks in a row: nothing left to release
        time.sleep(0.005)  # releases the GIL: a worker that still has to free Python tensors gets it now
        idle_checks = 0 if _busy_gloo_workers() else idle_checks + 1
