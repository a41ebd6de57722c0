"""Stop on a signal: preemption (SIGTERM) or Slurm's warning before the time limit (SIGUSR1) ends training at the
next optimizer step with a complete checkpoint, every rank at the same step; the recipe then exits with
`INTERRUPTED_EXIT_CODE` and the same command with `--resume_from_checkpoint latest` goes on exactly.

Who sends what:
- Slurm, at the time limit minus N seconds with `#SBATCH --signal=USR1@N`: SIGUSR1 to every process of the job's
  steps (the launcher on each node and its ranks; slurm/train.sbatch starts the launcher with SIGUSR1 ignored, so
  only the ranks act on it);
- Slurm on preemption, `scancel` or `scontrol requeue`: SIGTERM to every process, SIGKILL KillWait seconds later
  (30 by default, a cluster setting);
- torchrun (and `accelerate launch`, which runs torchrun's agent) on its own SIGTERM: SIGTERM to each worker, SIGKILL
  30 s later (torch.distributed.elastic's `LocalElasticAgent._shutdown`);
- `kill -TERM` of a one-process run.
So the save must fit in that window: a checkpoint of the model, its optimizer moments and the data position.

Why agree: the signal reaches ranks at different moments (one node before another; torchrun forwards to its workers
one by one), and a checkpoint needs every rank at the same step. After each optimizer step every rank starts one
all_reduce (MAX) of the signal's number (0: none) and reads the one started a step before: so the ranks stop together
one step after the first of them saw the signal, and no step waits for the collective. It runs on a gloo group on
CPU tensors, so a CUDA step is not made to wait for the device either; a CPU (gloo) world uses its default group.
benchmarks/stop_on_signal.py measures what it costs a step that receives no signal.

The handler only records the signal (nothing else is safe inside a handler); the callback does the rest at the step
boundary. After training the previous handlers are back, so a signal during the final evaluation or upload acts as
before (the trained model's checkpoint is already on disk only if a save happened)."""

import os
import signal
import time

import torch
import torch.distributed as dist
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from hf_vit_scaling.errors import INTERRUPTED_EXIT_CODE, TrainingInterrupted, UserInputError
from hf_vit_scaling.training.checkpoints import checkpoint_problem
from hf_vit_scaling.utils import write_json_atomically

INTERRUPTED_FILE = "interrupted.json"  # in output_dir: what stopped the run, at which step, which checkpoint
UNCATCHABLE = ("SIGKILL", "SIGSTOP")


def parse_stop_signals(spec: str) -> tuple[signal.Signals, ...]:
    """`--stop_signals` -> the signals, e.g. "SIGTERM,SIGUSR1" (or "TERM,USR1"); "none" -> ()."""
    if spec.strip().lower() == "none":
        return ()
    found = []
    for name in filter(None, (part.strip().upper() for part in spec.split(","))):
        full = name if name.startswith("SIG") else f"SIG{name}"
        if full in UNCATCHABLE or not hasattr(signal.Signals, full):
            why = "cannot be caught" if full in UNCATCHABLE else "is not a signal name here"
            raise UserInputError(
                f"--stop_signals {spec!r}: {name} {why}. Fix: comma-separated names such as SIGTERM,SIGUSR1, or none."
            )
        found.append(signal.Signals[full])
    if not found:
        raise UserInputError(f"--stop_signals {spec!r} names no signal. Fix: e.g. SIGTERM,SIGUSR1, or none.")
    return tuple(dict.fromkeys(found))


def check_one_stop_handler(enable_jit_checkpoint: bool) -> None:
    """Refuse transformers' `--enable_jit_checkpoint`: one SIGTERM handler per process, ours (`--stop_signals`).

    Its `JITCheckpointCallback` installs its own SIGTERM handler (replacing whichever was there), starts a 3 s timer
    and then saves from inside whatever callback runs next, on each rank on its own: nothing makes the ranks save at
    the same step, so under DDP or ZeRO one rank can enter the save's collectives while another trains on. Beside
    `StopOnSignal` the two handlers would race for the same signal. `--stop_signals` (default SIGTERM,SIGUSR1) already
    gives a preempted run its checkpoint, agreed between ranks, marked complete, with exit 75."""
    if enable_jit_checkpoint:
        raise UserInputError(
            "--enable_jit_checkpoint is transformers' own SIGTERM checkpoint (a 3 s timer, no agreement between "
            "ranks); this recipe stops on a signal with --stop_signals, every rank at the same step, checkpoint "
            "marked complete, exit 75. Fix: drop --enable_jit_checkpoint (--stop_signals SIGTERM,SIGUSR1 is the "
            "default)."
        )


class StopOnSignal(TrainerCallback):
    """Records the first of `signals` this process receives; at the end of each optimizer step the ranks agree,
    and if any received one, the Trainer saves a checkpoint at this step and stops (`stopped` then holds
    {"signal", "step"}). A signal received after the last step changes nothing."""

    def __init__(self, signals: tuple[signal.Signals, ...]):
        self.signals = signals
        self.received: str | None = None  # this rank's first signal
        self.stopped: dict | None = None
        self._previous: dict = {}
        self._group = None
        self._flag = torch.zeros(1, dtype=torch.int32)
        self._pending = None  # the all_reduce started after the last step

    def _record(self, signum, frame) -> None:
        if self.received is None:
            self.received = signal.Signals(signum).name

    def on_train_begin(self, args, state, control, **kwargs):
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._record)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            # A CPU group beside NCCL's (every rank creates it: new_group is collective); gloo worlds use their own.
            self._group = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else dist.group.WORLD

    def agreed_signal(self) -> str | None:
        """The name of a signal some rank received (the largest number, if they differ), the same on every rank,
        or None. A collective: every rank calls it once after every optimizer step. On several processes it answers
        one step late: the all_reduce started after step N is waited for after step N+1 (long done by then), so no
        step waits on it (a blocking one cost a share of every step: docs/reliability.md, "What was measured")."""
        if self._group is None:
            return self.received
        agreed = 0
        if self._pending is not None:
            self._pending.wait()
            agreed = int(self._flag[0])
        self._flag = torch.tensor([signal.Signals[self.received].value if self.received else 0], dtype=torch.int32)
        self._pending = dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
        return signal.Signals(agreed).name if agreed else None

    def on_step_end(self, args, state, control, **kwargs):
        received = self.agreed_signal() if self.stopped is None else None
        if received is not None:
            self.stopped = {
                "signal": received,
                "step": state.global_step,
                "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
            control.should_save = True  # whatever --save_strategy says: this step's checkpoint is the resume point
            control.should_evaluate = False
            control.should_training_stop = True
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.stopped is not None:  # the step's checkpoint is saved: no second save or evaluation at epoch end
            control.should_save = control.should_evaluate = False
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self._pending is not None:  # every rank started one after its last step: finish it on every rank
            self._pending.wait()
            self._pending = None
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def raise_if_stopped(self, output_dir: str, is_main: bool) -> None:
        """After `Trainer.train`: if a signal stopped it, write output_dir/interrupted.json (main process) and raise
        `TrainingInterrupted` on every rank, naming the checkpoint to resume from."""
        if self.stopped is None:
            return
        folder = os.path.join(output_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.stopped['step']}")
        problem = checkpoint_problem(folder)
        record = {
            **self.stopped,
            "checkpoint": folder,
            "complete": problem is None,
            "exit_code": INTERRUPTED_EXIT_CODE,
        }
        if is_main:
            write_json_atomically(os.path.join(output_dir, INTERRUPTED_FILE), record)
        saved = f"saved {folder}" if problem is None else f"{folder} is not complete ({problem})"
        raise TrainingInterrupted(
            f"interrupted by {record['signal']} at step {record['step']}: {saved}. Resume: the same command with "
            f"--resume_from_checkpoint latest (exit {INTERRUPTED_EXIT_CODE}; slurm/train.sbatch requeues and resumes)."
        )
