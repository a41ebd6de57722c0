"""Fault injection for the reliability tests: real faults at chosen steps, switched on by an environment variable.

    HF_VIT_SCALING_FAULTS="sigkill@12:rank1,nan@7,save_fail@10"

- `sigkill@N[:rankR]`: the rank sends itself SIGKILL when step N starts (no cleanup, no Python handlers run:
  what a scheduler's kill or an OOM-kill does).
- `sigterm@N[:rankR]`: the rank sends itself SIGTERM when step N starts (`kill -TERM` of the process, Slurm's
  preemption); `sigterm_launcher@N[:rankR]`: it sends SIGTERM to its parent, the launcher (torchrun then sends
  SIGTERM to every worker). Both end in the checkpoint `--stop_signals` saves, unless it is `none`.
- `stall@N[:rankR]`: the rank sleeps STALL_SECONDS when step N starts (a slow step: a test's signal sent from outside,
  e.g. through Slurm, arrives while the run is still training).
- `nan@N[:rankR]`: at step N one value of that rank's patch embeddings becomes NaN (a one-shot forward hook), so
  the rest of the forward pass yields a NaN loss as an overflow would.
- `save_fail@N`: while checkpoint-N is written, the process's file-size limit (RLIMIT_FSIZE) drops to 4 KiB, so the
  kernel refuses the larger writes part-way (EFBIG), as a full disk would (ENOSPC).
- `prepare_sigkill@N`: the prepare step (recipes/prepare_shards.py) SIGKILLs its process group (itself and its
  pool's workers, mid-shard, as a scheduler's kill does) once N shards are complete; its own process group only
  when it leads one (else itself only).
Faults fire in a job's first attempt only: after torchrun restarts the workers (TORCHELASTIC_RESTART_COUNT > 0)
the job runs clean, as a real transient fault would leave it. Unset (the default), nothing here runs.
"""

import contextlib
import os
import resource
import signal
import time
from dataclasses import dataclass

from transformers import TrainerCallback

from hf_vit_scaling.errors import UserInputError

FAULTS_ENV = "HF_VIT_SCALING_FAULTS"
KINDS = ("sigkill", "sigterm", "sigterm_launcher", "stall", "nan", "save_fail", "prepare_sigkill")
SAVE_FAIL_LIMIT_BYTES = 4096
STALL_SECONDS = 4


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    rank: int | None = None  # None: every rank

    def hits(self, kind: str, step: int, rank: int) -> bool:
        return self.kind == kind and self.step == step and self.rank in (None, rank)


def parse_faults(spec: str | None) -> list[Fault]:
    faults = []
    for item in filter(None, (s.strip() for s in (spec or "").split(","))):
        try:
            kind, rest = item.split("@")
            step, _, rank = rest.partition(":rank")
            fault = Fault(kind, int(step), int(rank) if rank else None)
        except ValueError as err:
            raise UserInputError(f"{FAULTS_ENV}={spec!r}: expected KIND@STEP[:rankR], e.g. sigkill@12:rank1.") from err
        if kind not in KINDS:
            raise UserInputError(f"{FAULTS_ENV}={spec!r}: unknown fault {kind!r}; known: {', '.join(KINDS)}.")
        faults.append(fault)
    return faults


def faults_from_env() -> list[Fault]:
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        return []
    return parse_faults(os.environ.get(FAULTS_ENV))


def prepare_fault(shards_done: int, faults: list[Fault] | None = None) -> None:
    """`prepare_sigkill@N`: kill the prepare step's process group once `shards_done` reaches N."""
    faults = faults_from_env() if faults is None else faults
    if any(f.hits("prepare_sigkill", shards_done, 0) for f in faults):
        if os.getpgid(0) == os.getpid():
            os.killpg(0, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


class FaultInjector(TrainerCallback):
    """The one entry point for injected faults; every method does nothing unless `HF_VIT_SCALING_FAULTS` asks.

    - `on_step_begin` (a Trainer callback): `sigkill@N` kills this process when step N begins, `sigterm@N` and
      `sigterm_launcher@N` send SIGTERM to it or to its launcher, `stall@N` sleeps;
    - `before_training_step(model, step)`: `nan@N` arms a one-shot NaN in the embeddings' output;
    - `during_save(step)`: `save_fail@N` makes writes fail part-way while checkpoint-N is written.
    """

    def __init__(self, rank: int, faults: list[Fault] | None = None):
        self.rank = rank
        self.faults = faults_from_env() if faults is None else faults

    def __bool__(self) -> bool:
        return bool(self.faults)

    def _hits(self, kind: str, step: int) -> bool:
        return any(f.hits(kind, step, self.rank) for f in self.faults)

    def on_step_begin(self, args, state, control, **kwargs):
        step = state.global_step + 1
        if self._hits("sigkill", step):
            os.kill(os.getpid(), signal.SIGKILL)
        if self._hits("sigterm", step):
            os.kill(os.getpid(), signal.SIGTERM)
        if self._hits("sigterm_launcher", step):
            os.kill(os.getppid(), signal.SIGTERM)
        if self._hits("stall", step):
            time.sleep(STALL_SECONDS)

    def before_training_step(self, model, step: int) -> None:
        if self._hits("nan", step):
            poison_forward(model)

    def during_save(self, step: int):
        return failing_writes() if self._hits("save_fail", step) else contextlib.nullcontext()


def poison_forward(model) -> None:
    """Arm a one-shot hook that puts a NaN into the embeddings' output of the next forward pass."""
    embeddings = next(m for name, m in model.named_modules() if name.endswith("embeddings"))

    def put_nan(module, args, output):
        handle.remove()
        output = output.clone()
        output.view(-1)[0] = float("nan")
        return output

    handle = embeddings.register_forward_hook(put_nan)


@contextlib.contextmanager
def failing_writes():
    """Within the block, writes past SAVE_FAIL_LIMIT_BYTES fail with EFBIG, as on a full disk."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills us instead of EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (SAVE_FAIL_LIMIT_BYTES, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous_handler)
