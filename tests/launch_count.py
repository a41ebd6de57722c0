"""A pytest plugin: the processes the suite starts, counted and printed at the end of the session.

Most of a launched test's time is starting processes (importing torch, transformers and DeepSpeed in each), not
training, so the count of launches is the suite's cost to watch: each test starts its commands through
`subprocess` (tests/helpers/launchers.py), and every `subprocess.Popen` a test process makes is counted here by its
program's name (`torchrun` runs as `python -m torch.distributed.run`: counted as `torchrun`). A launcher's own
children (torchrun's ranks, a shell script's commands) are not counted: one launch is one command a test ran.
Under pytest-xdist each worker counts its own and sends the counts to the controller, which prints the sum."""

import shlex
import subprocess
from collections import Counter
from pathlib import Path

COUNTS: Counter = Counter()
_popen_init = subprocess.Popen.__init__


def program_name(args) -> str:
    """`torchrun` for `python -m torch.distributed.run ...`, else the basename of the program (a string command, as
    `shell=True` takes it: its first word)."""
    argv = (
        shlex.split(args) if isinstance(args, str) else [str(a) for a in ([args] if isinstance(args, Path) else args)]
    )
    if argv[1:3] == ["-m", "torch.distributed.run"]:
        return "torchrun"
    return Path(argv[0]).name if argv else "?"


def counting_init(self, args, *rest, **kwargs):
    COUNTS[program_name(args)] += 1
    _popen_init(self, args, *rest, **kwargs)


def pytest_configure(config):
    subprocess.Popen.__init__ = counting_init
    config.launch_counts = Counter()


def pytest_unconfigure(config):
    subprocess.Popen.__init__ = _popen_init


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: send its counts to the controller
        workeroutput["launch_counts"] = dict(COUNTS)


def pytest_testnodedown(node, error):
    getattr(node.config, "launch_counts", Counter()).update(getattr(node, "workeroutput", {}).get("launch_counts", {}))


def launch_summary(counts: Counter) -> str:
    programs = ", ".join(f"{name} {n}" for name, n in counts.most_common())
    return f"process launches: {sum(counts.values())} ({programs})"


def pytest_terminal_summary(terminalreporter, config):
    counts = config.launch_counts if config.launch_counts else COUNTS  # the controller's sum, or this process's
    if counts:
        terminalreporter.write_line(launch_summary(counts))
