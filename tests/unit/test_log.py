"""One `error:` line per failure, from the right ranks, and the recipe's exit codes."""

import pytest
import torch.distributed

from hf_vit_scaling.errors import CheckpointSaveError, NonFiniteLossError, UserInputError, exit_code_for
from hf_vit_scaling.log import logger, setup_logging
from tests.helpers.launchers import error_lines


@pytest.fixture(autouse=True)
def rank_from_the_environment(monkeypatch):
    """The rank comes from RANK, as before a process group exists: an in-process test elsewhere may have left a
    one-process group behind, which would make every rank 0 here."""
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)


@pytest.mark.parametrize(
    ("rank", "err", "code", "shown"),
    [
        ("0", UserInputError("--x is bad. Fix: y."), 2, True),
        ("1", UserInputError("--x is bad. Fix: y."), 2, False),  # every rank knows: the main process says it
        ("1", NonFiniteLossError("non-finite loss at step 3"), 1, False),
        ("1", CheckpointSaveError("saving checkpoint-8 failed"), 1, True),  # only this rank may know
    ],
)
def test_errors_become_one_line_and_an_exit_code(monkeypatch, capsys, rank, err, code, shown):
    monkeypatch.setenv("RANK", rank)
    assert exit_code_for(err) == code
    captured = capsys.readouterr()
    assert error_lines(captured.err) == ([f"error: {err}"] if shown else [])
    assert captured.out == ""


def test_info_only_from_the_main_process(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "1")
    setup_logging()
    logger.info("Done: from rank 1")
    monkeypatch.setenv("RANK", "0")
    setup_logging()
    logger.info("Done: from rank 0")
    assert capsys.readouterr().out == "Done: from rank 0\n"


def test_anything_else_is_not_swallowed():
    with pytest.raises(TypeError):
        exit_code_for(RuntimeError("a bug"))
