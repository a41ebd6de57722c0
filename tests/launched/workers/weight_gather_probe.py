"""Runs recipes/train_vit.py in this process (same arguments) and, when it exits, writes to
$WEIGHT_GATHER_PROBE_DIR/rank{R}.json how many ZeRO-1/2 weight gathers its steps left in flight
(`parallel.fast_paths.weight_gathers`) and what finished each: the next training step, a `state_dict()` (the
model's pre-hook, a lambda), a Trainer event (`finishing`) or an evaluation. For
tests/launched/test_weights_gathered_late.py."""

import json
import os
import runpy
import sys
import traceback
from collections import Counter
from pathlib import Path

from hf_vit_scaling.parallel.fast_paths.weight_gathers import IN_FLIGHT, GathersInFlight

RECIPE = Path(__file__).resolve().parents[3] / "recipes" / "train_vit.py"
FINISHERS = ("training_step", "<lambda>", "finishing", "evaluate", "predict")  # weight_gathers.py's callers
left, finished_by = [0], Counter()


def append_counted(self, finish):
    """`GathersInFlight.append`, counting what is put in and naming what finished each."""
    left[0] += 1

    def finish_and_name():
        caller = next((f.name for f in reversed(traceback.extract_stack()) if f.name in FINISHERS), "?")
        finished_by[caller] += 1
        finish()

    list.append(self, finish_and_name)


def main() -> None:
    GathersInFlight.append = append_counted
    sys.argv = [str(RECIPE), *sys.argv[1:]]
    try:
        runpy.run_path(str(RECIPE), run_name="__main__")
    finally:
        folder = Path(os.environ["WEIGHT_GATHER_PROBE_DIR"])
        folder.mkdir(parents=True, exist_ok=True)
        rank = int(os.environ.get("RANK", "0"))
        facts = {"left_in_flight": left[0], "finished_by": dict(finished_by), "still": len(IN_FLIGHT)}
        (folder / f"rank{rank}.json").write_text(json.dumps(facts), encoding="utf-8")


if __name__ == "__main__":
    main()
