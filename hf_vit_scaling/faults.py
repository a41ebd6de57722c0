"""Fault injection for the reliability tests: real faults at chosen steps, switched on by an environment variable.

    HF_VIT_SCALING_FAULTS="sigkill@12:rank1,nan@7,save_fail@10"

- `sigkill@N[:rankR]`: the rank sends itself SIGKILL when step N starts (no cleanup, no Python handlers run:
  what a scheduler's kill or an OOM-kill does).
- `nan@N[:rankR]`: at step N one value of that rank's patch embeddings becomes NaN (a one-shot forward hook), so
  the rest of the forward pass yields a NaN loss as an overflow would.
- `save_fail@N`: while checkpoint-N is written, the process's file-size limit (RLIMIT_FSIZE) drops to 4 KiB, so the
  kernel refuses the larger writes part-way (EFBIG), as a full disk would (ENOSPC).
Faults fire in a job's first attempt only: after torchrun restarts the workers (TORCHELASTIC_RESTART_COUNT > 0)
the job runs clean, as a real transient fault would leave it. Unset (the default), nothing here runs.
"""

import contextlib
import os
import resource
import signal
from dataclasses import dataclass

from transformers import TrainerCallback

from .errors import UserInputError

FAULTS_ENV = "HF_VIT_SCALING_FAULTS"
KINDS = ("sigkill", "nan", "save_fail")
SAVE_FAIL_LIMIT_BYTES = 4096


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


class SigkillFault(TrainerCallback):
    """Kill this process with SIGKILL when the chosen step begins."""

    def __init__(self, faults: list[Fault], rank: int):
        self.faults, self.rank = faults, rank

    def on_step_begin(self, args, state, control, **kwargs):
        if any(f.hits("sigkill", state.global_step + 1, self.rank) for f in self.faults):
            os.kill(os.getpid(), signal.SIGKILL)


def poison_forward(model, faults: list[Fault], step: int, rank: int) -> None:
    """Arm a one-shot hook that puts a NaN into the embeddings' output of the next forward pass."""
    if not any(f.hits("nan", step, rank) for f in faults):
        return
    embeddings = next(m for name, m in model.named_modules() if name.endswith("embeddings"))

    def put_nan(module, args, output):
        handle.remove()
        output = output.clone()
        output.view(-1)[0] = float("nan")
        return output

    handle = embeddings.register_forward_hook(put_nan)


@contextlib.contextmanager
def failing_writes(faults: list[Fault], step: int, rank: int):
    """Within the block, writes past SAVE_FAIL_LIMIT_BYTES fail with EFBIG (only when a save_fail fault hits)."""
    if not any(f.hits("save_fail", step, rank) for f in faults):
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills us instead of EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (SAVE_FAIL_LIMIT_BYTES, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous_handler)
