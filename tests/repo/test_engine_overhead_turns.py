"""benchmarks/engine_overhead.py's `Turns`: arms started together run their steps in turns, never at once. Two arms of
two processes each (as two-process arms are), `steps` 2 at a time, each process writing when each of its steps began
and ended; an arm's ranks take their turn together, and every arm waits for the others before it ends. And the wait
for a turn is left out of the throughput report's step times."""

import json
import subprocess
import sys

from tests.helpers.launchers import REPO

STEP = """
import json, sys, time
sys.path.insert(0, {benchmarks!r})
from engine_overhead import Turns
folder, arm, rank, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
turns = Turns(folder, arm, arms=2, ranks=2, steps=2)
turns.start(rank)
marks = []
for step in range(steps):
    begin = time.monotonic()
    time.sleep(0.02 * (1 + arm) + 0.03 * rank)  # slower arm 1, slower rank 1: a turn waits for the arm's last rank
    marks.append((begin, time.monotonic()))
    turns.step_ended(last=step == steps - 1)
marks.append(time.monotonic())  # when it returned from its last step
print(json.dumps(marks))
"""


def run_arms(folder, steps: int) -> dict:
    sys.path.insert(0, str(REPO / "benchmarks"))
    from engine_overhead import Turns

    Turns.prepare(str(folder), arms=2, ranks=2)
    script = STEP.format(benchmarks=str(REPO / "benchmarks"))
    procs = {
        (arm, rank): subprocess.Popen(
            [sys.executable, "-c", script, str(folder), str(arm), str(rank), str(steps)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for arm in (1, 0)  # arm 1 ready first: arm 0 still goes first
        for rank in (0, 1)
    }
    marks = {}
    for key, proc in procs.items():
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        marks[key] = json.loads(out)
    return marks


def test_arms_take_turns_and_wait_for_each_other_at_the_end(tmp_path):
    marks = run_arms(tmp_path, steps=5)
    steps = sorted((begin, end, arm) for (arm, _), m in marks.items() for begin, end in m[:-1])
    # at no time do the two arms step at once
    for (_, end, arm), (begin, _, next_arm) in zip(steps, steps[1:]):
        assert arm == next_arm or end <= begin, steps
    # turns of 2 steps, arm 0 first, the last turn of 1 step (5 steps each): per arm's rank 0, in time order
    order = [arm for _, _, arm in sorted((b, e, a) for (a, r), m in marks.items() if r == 0 for b, e in m[:-1])]
    assert order == [0, 0, 1, 1, 0, 0, 1, 1, 0, 1]
    # no process returns from its last step before every arm has run all of its steps
    last_step_end = max(end for _, end, _ in steps)
    assert min(m[-1] for m in marks.values()) >= last_step_end


def test_the_wait_for_a_turn_is_no_step_s_data_wait(tmp_path, monkeypatch):
    """`TurnTaking` pauses the throughput report over a turn's wait: the step after it is not measured. Without the
    pause (seen: the median was 0.31 s), the wait was that step's data wait; paused after every step (seen), no step
    was measured."""
    from types import SimpleNamespace

    import pytest
    from transformers import TrainerControl, TrainerState, TrainingArguments, ViTForImageClassification

    from hf_vit_scaling.throughput import timing
    from tests.helpers.builders import tiny_vit_config

    sys.path.insert(0, str(REPO / "benchmarks"))
    from engine_overhead import TurnTaking

    clock = SimpleNamespace(now=1000.0)
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=lambda: clock.now))

    class OthersTakeTheirTurns:  # after steps 1, 2, 4 and 5 the other arms run for 0.3 s
        done = 0

        def step_ended(self, last):
            self.done += 1
            waits = self.done in (1, 2, 4, 5)
            clock.now += 0.3 * waits
            return waits

    throughput, taking = (
        timing.ThroughputCallback(warmup_steps=0, print_table=False),
        TurnTaking(OthersTakeTheirTurns()),
    )
    taking.trainer = SimpleNamespace(callback_handler=SimpleNamespace(callbacks=[throughput, taking]))
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    state, control = TrainerState(is_world_process_zero=True), TrainerControl()
    throughput.on_train_begin(args, state, control, model=ViTForImageClassification(tiny_vit_config()))
    for _ in range(7):
        for callback in (throughput, taking):
            callback.on_step_begin(args, state, control)
        clock.now += 0.01  # the step
        for callback in (throughput, taking):
            callback.on_step_end(args, state, control)
    throughput.on_train_end(args, state, control)
    step_times = throughput.report["step_time_s"]
    assert step_times["median"] == pytest.approx(0.01) and step_times["data_wait_mean"] == pytest.approx(0.0)
