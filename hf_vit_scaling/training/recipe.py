"""What every recipe builds the same way from its parsed arguments, in one place: the Trainer's arguments (its
datasets, metrics and features), the throughput report's settings, and the boundary where an error becomes the
process's exit code. A recipe keeps its `main` and what is its own (its model, its Trainer class, its end).

A new Trainer feature therefore goes into `trainer_arguments` once and reaches every recipe built on `VitTrainer`.
This module imports only `errors` and `parallel.distributed`, so the minimal recipe can use its exit codes without
loading the training run.
"""

from collections.abc import Callable

from hf_vit_scaling.errors import TrainingInterrupted, TrainingStopped, UserInputError, exit_code_for
from hf_vit_scaling.parallel.distributed import shutdown_distributed


def throughput_settings(args, world, inputs) -> dict:
    """The `ThroughputCallback`'s settings (`throughput.timing`): warm-up steps, the peak TFLOPS, the engine, simulated
    slow ranks, per-rank batches, sequence parallelism and a distillation teacher (its forward FLOPs join the MFU)."""
    return dict(
        warmup_steps=args.report.throughput_warmup_steps,
        peak_tflops=args.report.peak_tflops,
        engine=world.engine,
        slow_ranks=args.cluster.slow_ranks,
        rank_batches=inputs.rank_batches,
        sequence_parallel_size=args.engine.sequence_parallel_size,
        teacher_config=inputs.teacher_config,
    )


def trainer_arguments(args, world, inputs) -> dict:
    """The keyword arguments of `VitTrainer` (and its subclasses) besides the model, `args` and the processor: the
    splits, collate and metrics of `inputs` (`training.run.TrainerInputs`) and every feature the flags turn on. A
    feature a recipe refuses at parse time arrives here off (None, or its default), so one set serves every recipe."""
    reliability = args.reliability
    return dict(
        train_dataset=inputs.splits["train"],
        eval_dataset=inputs.splits["validation"],
        data_collator=inputs.collate,
        compute_metrics=inputs.compute_metrics,
        compute_loss_func=inputs.compute_loss_func,
        model_card=inputs.model_card,
        rank_batches=inputs.rank_batches,
        sequence_parallel=world.sequence_parallel,
        nonfinite_policy=reliability.on_nonfinite_loss,
        trace_samples=reliability.trace_samples,
        stop_signals=reliability.signals,
        optimization=world.optimization,
        ema=inputs.ema,
        throughput=throughput_settings(args, world, inputs),
    )


def exit_code_of(run: Callable[..., None], *args, **kwargs) -> int:
    """`run(*args, **kwargs)` (a recipe's body) as its process's exit code: 0 when it returns; 2 for bad input
    (`UserInputError`: nothing expensive started or nothing written); 1 for a stopped run (`TrainingStopped`: a
    non-finite loss or a failed save, the message names the safe checkpoint); 75 when a stop signal ended it
    (`TrainingInterrupted`: every rank saved the step's checkpoint; run again to resume). Each is one line
    (`errors.exit_code_for`), never a traceback.

    An interrupted run drains the process group here, as a finished one does at the end of its body: its ranks
    stopped together at a step boundary. A stopped run does not: a rank may have left the others mid-collective."""
    try:
        run(*args, **kwargs)
    except TrainingInterrupted as err:  # before TrainingStopped: it is one
        shutdown_distributed()
        return exit_code_for(err)
    except (UserInputError, TrainingStopped) as err:
        return exit_code_for(err)
    return 0
