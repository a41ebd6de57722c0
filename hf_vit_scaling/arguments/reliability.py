"""The throughput report's settings and the reliability group (non-finite losses, sample traces, stop signals)."""

from dataclasses import dataclass, field

from hf_vit_scaling.arguments.field_checks import require_at_least
from hf_vit_scaling.errors import UserInputError
from hf_vit_scaling.training.interruption import parse_stop_signals


@dataclass
class ReportArguments:
    """The throughput report."""

    throughput_warmup_steps: int = field(
        default=5, metadata={"help": "Optimizer steps excluded from the throughput report as warm-up."}
    )
    peak_tflops: float | None = field(
        default=None,
        metadata={"help": "Per-device peak TFLOP/s for MFU. Default: a table for known GPUs, a matmul probe on CPU."},
    )

    def __post_init__(self):
        require_at_least(self, 0, "throughput_warmup_steps")
        if self.peak_tflops is not None and self.peak_tflops <= 0:
            raise UserInputError("--peak_tflops must be positive (TFLOP/s per device).")


@dataclass
class ReliabilityArguments:
    """What happens on bad numbers, and what is recorded to audit a resumed run.
    (Resuming: TrainingArguments' --resume_from_checkpoint PATH, or `latest` for the newest complete checkpoint.)"""

    on_nonfinite_loss: str = field(
        default="stop",
        metadata={
            "help": "A NaN or inf training loss on any rank: stop ends training with an error naming the step and the "
            "newest complete checkpoint; skip leaves that optimizer step out on every rank and counts it "
            "(needs --gradient_accumulation_steps 1).",
            "choices": ["stop", "skip"],
        },
    )
    trace_samples: bool = field(
        default=False,
        metadata={
            "help": "Append each step's dataset rows to output_dir/sample_trace/rank{R}.jsonl, to check the "
            "data order of resumed runs."
        },
    )
    stop_signals: str = field(
        default="SIGTERM,SIGUSR1",
        metadata={
            "help": "Signals that end training at the next optimizer step, on every rank together, with a complete "
            "checkpoint and output_dir/interrupted.json, then exit 75 (run the same command with "
            "--resume_from_checkpoint latest to go on exactly): SIGTERM (preemption, scancel, torchrun's stop, kill) "
            "and SIGUSR1 (Slurm's warning before the time limit, #SBATCH --signal=USR1@300); comma-separated names, "
            "or none for the default actions (the process dies)."
        },
    )

    def __post_init__(self):
        # Parsed once, here (an unknown name: an error naming --stop_signals); the Trainer takes the signals.
        self.signals = parse_stop_signals(self.stop_signals)
