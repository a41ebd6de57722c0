"""One logger for the package and its recipes: messages from the main process only, errors as one `error:` line.

`setup_logging()` sends `hf_vit_scaling` records to stdout as plain lines (level INFO on the main process, WARNING
elsewhere, so per-rank facts are gathered and printed once) and errors to stderr as `error: <message>`. Other
libraries keep their own verbosity (transformers: the Trainer's `--log_level`).
"""

import logging
import sys

from hf_vit_scaling.errors import INTERRUPTED_EXIT_CODE, TrainingInterrupted, TrainingStopped, UserInputError
from hf_vit_scaling.parallel.distributed import is_main_process

logger = logging.getLogger("hf_vit_scaling")


class _CurrentStream(logging.StreamHandler):
    """Writes to whatever sys.stdout/sys.stderr is when a record is emitted (pytest's capture, a redirect)."""

    def __init__(self, name: str):
        super().__init__()
        self.name_of_stream = name

    @property
    def stream(self):
        return getattr(sys, self.name_of_stream)

    @stream.setter
    def stream(self, value):  # logging.StreamHandler.__init__ assigns it; the property decides
        pass


class _BelowError(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR


def setup_logging(transformers_level: int | None = None) -> None:
    """Configure our logger (idempotent); optionally set transformers' verbosity (e.g. the Trainer's process level)."""
    if not logger.handlers:
        out = _CurrentStream("stdout")
        out.setFormatter(logging.Formatter("%(message)s"))
        out.addFilter(_BelowError())
        err = _CurrentStream("stderr")
        err.setFormatter(logging.Formatter("error: %(message)s"))
        err.setLevel(logging.ERROR)
        logger.addHandler(out)
        logger.addHandler(err)
        logger.propagate = False
    logger.setLevel(logging.INFO if is_main_process() else logging.WARNING)
    if transformers_level is not None:
        import transformers

        transformers.utils.logging.set_verbosity(transformers_level)


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
