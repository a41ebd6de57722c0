"""ZeRO-1/2 on several CPU processes leaves each step's gather of the updated weights in flight while the Trainer
runs its step-end callbacks and loads the next batch (`parallel/fast_paths/weight_gathers.py`): the time
changes, not the numbers. Two processes (torchrun over gloo), ZeRO-2, 4 steps with a checkpoint at step 2 and an
evaluation at step 3 and at the end, through tests/launched/workers/weight_gather_probe.py, which counts the gathers
left in flight and names what finished each: the next training step, the checkpoint's `state_dict()`, an evaluation.
Against the same run with DeepSpeed's own code (HF_VIT_SCALING_DEEPSPEED_FAST_PATHS=0): the same losses, gradient
norms, evaluation loss, checkpoint and final weights, bit for bit. With EMA on (a callback that reads the weights
at each step's end) nothing is left in flight."""

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.launchers import DS_CONFIGS, WORKERS, read_json, run_recipe

pytestmark = pytest.mark.distributed
STEPS = 4
ARGS = ["--max_steps", str(STEPS), "--logging_steps", "1", "--save_strategy", "steps", "--save_steps", "2",
        "--eval_strategy", "steps", "--eval_steps", "3", "--max_eval_samples", "32",
        "--ds_config", str(DS_CONFIGS / "zero2.json")]  # fmt: skip
RUNS = {  # name: (extra flags, environment)
    "late": ([], {}),
    "deepspeed": ([], {"HF_VIT_SCALING_DEEPSPEED_FAST_PATHS": "0"}),
    "ema": (["--ema_decay", "0.9"], {}),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """{name: (output folder, each rank's probe facts)}."""
    results = {}
    for name, (flags, env) in RUNS.items():
        out = tmp_path_factory.mktemp(f"late_{name}")
        probe = out / "probe"
        run_recipe(out, *ARGS, *flags, launcher="torchrun", nproc=2, script=WORKERS / "weight_gather_probe.py",
                   WEIGHT_GATHER_PROBE_DIR=str(probe), **env)  # fmt: skip
        results[name] = (out, [read_json(probe / f"rank{rank}.json") for rank in range(2)])
    return results


def logged(out, key: str) -> list[float]:
    return [entry[key] for entry in read_json(out / "trainer_state.json")["log_history"] if key in entry]


def test_each_step_leaves_its_gather_in_flight_until_the_weights_are_read(runs):
    # step 1's finished by step 2's training step, step 2's by its checkpoint's state_dict(), steps 3 and 4's by
    # the evaluations that follow them (eval_steps 3, and the Trainer's at max_steps)
    for rank, facts in enumerate(runs["late"][1]):
        assert facts["left_in_flight"] == STEPS and facts["still"] == 0, (rank, facts)
        assert facts["finished_by"] == {"training_step": 1, "<lambda>": 1, "evaluate": 2}, (rank, facts)
    for facts in runs["deepspeed"][1]:
        assert facts["left_in_flight"] == 0, facts


def test_same_numbers_as_deepspeed_s_own_code(runs):
    late, own = runs["late"][0], runs["deepspeed"][0]
    for key in ("loss", "grad_norm", "eval_loss"):
        assert logged(late, key) == logged(own, key) and len(logged(own, key)) >= 2, (key, logged(late, key))
    for weights in ("checkpoint-2/model.safetensors", "model.safetensors"):
        mine, theirs = load_file(late / weights), load_file(own / weights)
        different = [name for name, tensor in theirs.items() if not torch.equal(tensor, mine[name])]
        assert mine.keys() == theirs.keys() and not different, (weights, different[:5])


def test_a_callback_that_reads_the_weights_at_a_step_end_keeps_the_gather_in_the_step(runs):
    ema, own = runs["ema"], runs["deepspeed"][0]
    assert [facts["left_in_flight"] for facts in ema[1]] == [0, 0], ema[1]
    assert logged(ema[0], "loss") == logged(own, "loss")  # EMA keeps its own copy: the trained weights are the same
