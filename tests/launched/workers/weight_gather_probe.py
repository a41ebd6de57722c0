"""Runs recipes/train_vit.py in this process (same arguments) and, when it exits, writes to
$WEIGHT_GATHER_PROBE_DIR/rank{R}.json how many ZeRO-1/2 weight gathers its steps left in flight
(`deepspeed_fast_paths.weights_gathered_late`) and what finished each: the next training step, a `state_dict()`, a
Trainer event or the end of `train`. For tests/launched/test_weights_gathered_late.py."""

import json
import os
import runpy
import sys
import traceback
from collections import Counter
from pathlib import Path

import hf_vit_scaling.parallel.deepspeed_fast_paths as fast_paths

RECIPE = Path(__file__).resolve().parents[3] / "recipes" / "train_vit.py"
FINISHERS = ("training_step", "<lambda>", "finishing", "train", "evaluate", "predict")  # trainer.py's callers


class CountingList(list):
    """The module's list of gathers in flight, counting what is put in and naming what finished each."""

    def __init__(self):
        super().__init__()
        self.left, self.finished_by = 0, Counter()

    def append(self, finish):
        self.left += 1

        def finish_and_name():
            caller = next((f.name for f in reversed(traceback.extract_stack()) if f.name in FINISHERS), "?")
            self.finished_by[caller] += 1
            finish()

        super().append(finish_and_name)


def main() -> None:
    fast_paths._IN_FLIGHT = in_flight = CountingList()
    sys.argv = [str(RECIPE), *sys.argv[1:]]
    try:
        runpy.run_path(str(RECIPE), run_name="__main__")
    finally:
        folder = Path(os.environ["WEIGHT_GATHER_PROBE_DIR"])
        folder.mkdir(parents=True, exist_ok=True)
        rank = int(os.environ.get("RANK", "0"))
        facts = {"left_in_flight": in_flight.left, "finished_by": dict(in_flight.finished_by), "still": len(in_flight)}
        (folder / f"rank{rank}.json").write_text(json.dumps(facts), encoding="utf-8")


if __name__ == "__main__":
    main()
