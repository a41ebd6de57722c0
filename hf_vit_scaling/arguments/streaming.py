"""The streaming group (`--streaming` and its sources), and what a stream refuses before anything loads."""

from dataclasses import dataclass, field

from hf_vit_scaling.errors import UserInputError


@dataclass
class StreamingArguments:
    """Streaming the training data instead of loading it (`--max_steps` sets the schedule)."""

    streaming: bool = field(
        default=False,
        metadata={
            "help": "Stream the training split: each rank reads its own shards, rows are never all in memory, and "
            "checkpoints hold the data position (exact resume). Needs --max_steps. Sources: --dataset_name (a Hub id, "
            "or a folder/URL of uint8 Parquet shards with manifest.json) or --train_files. See docs/streaming.md."
        },
    )
    shuffle_buffer_size: int = field(
        default=1000,
        metadata={
            "help": "--streaming: rows drawn at random from a buffer of this many (per rank and worker), filled "
            "from up to 10 shards at a time, on top of a seeded shard order per pass. 0: seeded shard order only, one "
            "shard read at a time (least memory; without workers, resume is a seek instead of a replay)."
        },
    )
    train_files: str | None = field(
        default=None,
        metadata={
            "help": "--streaming: Parquet or Arrow files of the training split, local or remote (glob patterns, "
            "comma-separated), e.g. 'hf://datasets/ORG/NAME/data/train-*.parquet'."
        },
    )
    validation_files: str | None = field(
        default=None, metadata={"help": "--streaming: files of the evaluation split, as --train_files."}
    )

    def __post_init__(self):
        if self.shuffle_buffer_size < 0:
            raise UserInputError(f"--shuffle_buffer_size must be >= 0, got {self.shuffle_buffer_size}.")
        for flag in ("train_files", "validation_files"):
            if getattr(self, flag) and not self.streaming:
                raise UserInputError(f"--{flag} reads files as a stream. Fix: add --streaming.")
        if self.validation_files and not self.train_files:
            raise UserInputError("--validation_files needs --train_files. Fix: add --train_files.")


def check_streaming(args) -> None:
    """Refuse, before anything loads, what a stream cannot do (args: the recipe's argument groups)."""
    if not args.streaming.streaming:
        return
    data, training = args.data, args.training

    def refuse(what: str, fix: str):
        raise UserInputError(f"--streaming {what}. Fix: {fix}.")

    if training.max_steps <= 0:
        refuse(
            "has no length to derive a schedule from (the Trainer needs --max_steps with an iterable data set)",
            "pass --max_steps N; one pass is rows / (per-device batch x processes) steps",
        )
    if data.train_dir:
        refuse("reads --dataset_name or --train_files, not --train_dir", "drop --train_dir or --streaming")
    if not (data.dataset_name or args.streaming.train_files):
        refuse("needs a source", "pass --dataset_name (Hub id or manifest folder) or --train_files")
    if data.dataset_name and args.streaming.train_files:
        refuse("takes one source", "pass --dataset_name or --train_files, not both")
    if data.max_train_samples:
        refuse("takes no --max_train_samples (a stream is not subsampled)", "bound training with --max_steps")
    if data.class_weighting != "none":
        refuse("cannot count the training labels up front for --class_weighting", "drop --class_weighting")
    if args.cluster.balance_batches != "off":
        refuse("forms equal batches per rank", "drop --balance_batches")
    if args.engine.sequence_parallel_size > 1:
        refuse(
            "gives every rank its own rows; sequence parallelism needs ranks that share images",
            "drop --sequence_parallel_size",
        )
    for flag in ("eval_strategy", "save_strategy"):
        if getattr(training, flag) == "epoch":
            refuse(
                f"has no epochs for --{flag} epoch (passes follow each other within one Trainer epoch)",
                f"use --{flag} steps",
            )
