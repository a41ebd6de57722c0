#!/usr/bin/env python
"""Time a command as a newcomer runs it: in a fresh clone of this repository's HEAD, from the start, and record the
wall time, the exit status and the end of its output with the provenance (commit, CPU, versions, date).

    python benchmarks/time_command.py --output benchmarks/results/make_train.json -- make train
    python benchmarks/time_command.py --output benchmarks/results/make_test.json -- env CI=true bash .ci/run
    python benchmarks/time_command.py --commit 34c35c4 --output before.json -- env CI=true bash .ci/run

The clone goes to a temporary folder (removed afterwards); caches outside the repository (pip's, the DeepSpeed CPU
ops in ~/.cache/torch_extensions) are used as a second run on the same machine would use them. What was timed: the
whole command, setup included (`make train` and `make test` create .venv and install first).
"""

import argparse
import subprocess
import sys
import tempfile
import time

from _common import REPO, report_result  # benchmarks/_common.py (scripts run as benchmarks/<name>.py)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default=None, help="Write the result as JSON here (with its provenance).")
    parser.add_argument("--commit", default="HEAD", help="Check out this commit in the clone first.")
    parser.add_argument("--tail_lines", type=int, default=60, help="Lines of the command's standard output to keep.")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="The command, after `--`.")
    args = parser.parse_args()
    args.command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not args.command:
        parser.error("give the command to time after `--`, e.g. -- make train")
    return args


def main() -> int:
    args = parse()
    with tempfile.TemporaryDirectory(prefix="time-command-") as tmp:
        clone = f"{tmp}/clone"
        subprocess.run(["git", "clone", "-q", str(REPO), clone], check=True)
        subprocess.run(["git", "checkout", "-q", args.commit], cwd=clone, check=True)
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True, text=True)
        start = time.perf_counter()
        proc = subprocess.run(args.command, cwd=clone, capture_output=True, text=True)
        wall = time.perf_counter() - start
    report_result({
        "timed": " ".join(args.command),
        "where": f"a fresh clone of {args.commit} (git clone), setup included",
        "wall_s": round(wall, 1),
        "wall_min": round(wall / 60, 2),
        "exit_code": proc.returncode,
        "output_tail": proc.stdout.splitlines()[-args.tail_lines :],  # what the command prints as its result
        "stderr_tail": proc.stderr.splitlines()[-20:],  # progress bars and warnings; an error line
    }, args.output, commit=commit.stdout.strip())  # fmt: skip
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
