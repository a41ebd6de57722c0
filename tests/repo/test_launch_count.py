"""tests/launch_count.py: the suite's count of the processes its tests start."""

import subprocess
import sys
from collections import Counter

from tests.launch_count import COUNTS, launch_summary, program_name


def test_program_names_count_torchrun_as_itself_and_others_by_their_basename():
    assert program_name([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "x.py"]) == "torchrun"
    assert program_name(["/venv/bin/accelerate", "launch", "x.py"]) == "accelerate"
    assert program_name(["/venv/bin/python3.11", "recipes/train_vit.py"]) == "python3.11"
    assert program_name("bash -c 'echo hi'") == "bash"


def test_a_process_this_session_starts_is_counted_and_summed():
    before = COUNTS["true"]
    subprocess.run(["true"], check=True)
    subprocess.run(["true"], check=True)
    assert COUNTS["true"] == before + 2
    assert launch_summary(Counter(torchrun=3, python=1)) == "process launches: 4 (torchrun 3, python 1)"
