"""The two ways a run ends early on purpose, each with one message for the user.

- `UserInputError`: bad input (a flag, a file, a config), found before expensive work where possible; the recipe
  prints `error: <message>` once and exits 2. The message names the flag or file and says how to fix it.
- `TrainingStopped`: training began but cannot go on safely (a non-finite loss, a failed checkpoint save); the
  recipe prints `error: <message>` and exits 1. The message names the newest complete checkpoint.
- `TrainingInterrupted`: a stop signal (preemption, the time limit's warning) ended training at a step boundary with a
  checkpoint; the recipe prints `interrupted by ...` (not an error) and exits 75, "run me again" (resume).

`exit_code_for(err)` is that mapping, kept beside the codes: a recipe's one boundary (`training.recipe.exit_code_of`)
hands it the error.
"""

from hf_vit_scaling.log import is_main_process, logger, setup_logging

# sysexits.h EX_TEMPFAIL, "a temporary failure; the user is invited to retry": not 1 (failed), not 128 + signal
# (killed). The run stopped on purpose, saved, and resumes when started again.
INTERRUPTED_EXIT_CODE = 75


class UserInputError(ValueError):
    """Bad input from the user: the message names the flag or file and says how to fix it."""


class TrainingStopped(Exception):
    """Training ended on purpose with a message for the user (exit 1).

    `every_rank_knows`: True when all ranks raise it with the same message (so only the main process prints it);
    False when only the failing rank may know (each rank that raises prints it)."""

    every_rank_knows = True


class NonFiniteLossError(TrainingStopped):
    """A NaN/inf training loss on some rank under `--on_nonfinite_loss stop`; the ranks agreed on it together."""


class TrainingInterrupted(TrainingStopped):
    """A stop signal ended training at a step boundary, on every rank, with a checkpoint to resume from (exit
    INTERRUPTED_EXIT_CODE)."""


class CheckpointSaveError(TrainingStopped):
    """Writing a checkpoint failed part-way; the rank whose write failed may be the only one that knows."""

    every_rank_knows = False


def exit_code_for(err: Exception) -> int:
    """Log `err` as one `error:` line and return the recipe's exit code: 2 for bad input, 1 for a stopped run; an
    interrupted run (a stop signal, a checkpoint saved) is one plain line from the main process and exit 75.

    Bad input is the same on every rank, so only the main process says it; a stopped run is said by the main process,
    and also by any rank that may be the only one to know (a failed save on that rank)."""
    setup_logging()
    if isinstance(err, TrainingInterrupted):
        if is_main_process():
            logger.warning(str(err))
        return INTERRUPTED_EXIT_CODE
    if isinstance(err, UserInputError):
        show, code = is_main_process(), 2
    elif isinstance(err, TrainingStopped):
        show, code = is_main_process() or not err.every_rank_knows, 1
    else:
        raise TypeError(f"not a recipe error: {err!r}") from err
    if show:
        logger.error(str(err))
    return code
