"""One logger for the package and its recipes: messages from the main process only, errors as one `error:` line.
It imports nothing from the package, so every module may log (`is_main_process` lives here for that reason, and
`parallel.distributed` offers it beside the other rank helpers).

`setup_logging()` sends `hf_vit_scaling` records to stdout as plain lines (level INFO on the main process, WARNING
elsewhere, so per-rank facts are gathered and printed once) and errors to stderr as `error: <message>`. Other
libraries keep their own verbosity (transformers: the Trainer's `--log_level`).
"""

import logging
import os
import sys

logger = logging.getLogger("hf_vit_scaling")


def is_main_process() -> bool:
    """Rank 0, asked the same way before and after the process group exists (launchers export RANK)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return os.environ.get("RANK", "0") == "0"


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
