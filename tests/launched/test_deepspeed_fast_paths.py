"""DeepSpeed's fast paths (`hf_vit_scaling.parallel.fast_paths.registry`) change the time, not the numbers: ZeRO-1, 2
and 3 runs of the same model and data, with DeepSpeed's own code and with the fast paths, log the same losses and
gradient norms and end with the same weights, bit for bit: on one process (the world-of-one reductions, the fp64
norm, the skipped re-pointing and ZeRO-2's reduction at the epilogue all run) and on two (torchrun over gloo: one
all-reduce for the groups' norms, one gather of the updated weights, one gather of ZeRO-3's persistent parameters,
each counted)."""

import sys

import pytest
import torch

from tests.helpers.deepspeed_range import highest_deepspeed, installed_deepspeed
from tests.helpers.launchers import WORKERS, launcher_cmd, run

pytestmark = pytest.mark.distributed
ZERO12_PATHS = ("zero12_grad_norm", "zero12_bit16_views", "zero12_single_rank_reduce")
ZERO2_PATHS = (*ZERO12_PATHS, "zero2_reduce_at_epilogue")
ZERO3_PATHS = ("zero3_grad_norm", "zero3_single_rank_reduce_scatter", "cpu_numa_cores_once")
WHOLE_THROUGH_STEP = (
    "zero3_whole_through_step",
    "zero3_whole_through_step_release",
    "zero3_whole_through_step_gather",
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("fast_paths") / "runs.pt"
    proc = run([sys.executable, WORKERS / "fast_paths_worker.py"], OUT=str(out))
    assert proc.returncode == 0, f"worker failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return torch.load(out)


@pytest.fixture(scope="module")
def two_process_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("fast_paths_2") / "runs.pt"
    proc = run([*launcher_cmd("torchrun", 2), WORKERS / "fast_paths_worker.py"], OUT=str(out))
    assert proc.returncode == 0, f"worker failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return torch.load(out)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit, NaN equal to NaN (DeepSpeed before 0.19.8 steps on the NaN gradients of "3-whole")."""
    return torch.allclose(a, b, rtol=0.0, atol=0.0, equal_nan=True)


def assert_same_numbers(own: dict, fast: dict, stage) -> None:
    assert len(own["losses"]) == 4 and len({float(loss) for loss in own["losses"]}) > 1  # it trained
    # The clip (0.05) is below every step's norm here, so the norm scales every update: a wrong norm moves the weights.
    # "3-whole": the second step's gradients are NaN and DeepSpeed skips it (its norm reads as inf); DeepSpeed before
    # 0.19.8 skips a ZeRO-3 step only on fp16 overflow and steps on it, and the fast paths must do as it does.
    norms = [float(norm) for norm in own["norms"]]
    skips_nan = installed_deepspeed() == highest_deepspeed()
    assert all(n > 0.05 for n in norms) and (stage != "3-whole" or not skips_nan or norms[1] == float("inf")), norms
    for step, (a, b) in enumerate(zip(own["losses"], fast["losses"]), 1):
        assert same(a, b), f"ZeRO-{stage} step {step}: loss {float(a)!r} with DeepSpeed, {float(b)!r} fast"
    for step, (a, b) in enumerate(zip(own["norms"], fast["norms"]), 1):
        assert same(a, b), f"ZeRO-{stage} step {step}: grad norm {float(a)!r} vs {float(b)!r}"
    different = [name for name, w in own["weights"].items() if not same(w, fast["weights"][name])]
    assert not different, f"ZeRO-{stage}: final weights differ in {different[:5]}"


def on(fast: dict, *names: str) -> bool:
    """Whether every fast path `names` was installed in the fast run (all are over setup.cfg's highest DeepSpeed;
    on its lowest some are off, and their tests then hold the run to DeepSpeed's own counts)."""
    return all(fast["status"][name] == "on" for name in names)


@pytest.mark.parametrize("stage", [1, 2, 3, "3-whole"])
def test_fast_paths_train_deepspeed_s_numbers_bit_for_bit(runs, stage):
    own, fast = runs[f"zero{stage}-deepspeed"], runs[f"zero{stage}-fast"]
    assert_same_numbers(own, fast, stage)
    # every fast path of the stage installed ran each step (a world of one, fp32 gradients): the equality is theirs
    paths = {1: ZERO12_PATHS, 2: ZERO2_PATHS, 3: ZERO3_PATHS, "3-whole": ZERO3_PATHS}[stage]
    expected = [name for name in paths if on(fast, name)]
    assert {name: fast["calls"].get(name, 0) >= 4 for name in expected} == dict.fromkeys(expected, True), fast["calls"]
    # a world of one all-reduces nothing: not the gradient buckets, not the norm's sum (DeepSpeed: 2 or 3 a step)
    reducing = ("zero12_single_rank_reduce", "zero12_grad_norm") if stage in (1, 2) else ("zero3_grad_norm",)
    if on(fast, *reducing):
        assert fast["collectives"].get("all_reduce", 0) == 0 < own["collectives"]["all_reduce"], (fast, own)


def test_zero2_with_one_bucket_and_nothing_to_overlap_hooks_no_gradient(runs, two_process_runs):
    """ZeRO-2 with every gradient in one bucket and no overlap: no hook per gradient (DeepSpeed: one per tensor),
    the epilogue files them; the numbers are the bit-for-bit tests' ZeRO-2 on one process and on two."""
    for results in (runs, two_process_runs):
        own, fast = results["zero2-deepspeed"], results["zero2-fast"]
        assert fast["gradient_hooks"] == 0 < own["gradient_hooks"], (fast["gradient_hooks"], own["gradient_hooks"])
        assert fast["calls"]["zero2_no_gradient_hooks"] == 1 and fast["calls"]["zero2_reduce_at_epilogue"] == 4


@pytest.mark.parametrize("stage", [1, 2])
def test_zero12_file_every_gradient_in_one_loop(runs, two_process_runs, stage):
    """ZeRO-1/2 file no gradient through DeepSpeed's per-tensor call chain (`zero12_file_at_once`), which its own
    code runs for each of the model's gradients every step; the numbers are the bit-for-bit tests' (one process and
    two)."""
    for results in (runs, two_process_runs):
        own, fast = results[f"zero{stage}-deepspeed"], results[f"zero{stage}-fast"]
        tensors = len(own["weights"])
        assert (own["filed_one_by_one"], fast["filed_one_by_one"]) == (4 * tensors, 0)
    assert runs["zero1-fast"]["calls"]["zero12_file_at_once"] == 4  # ZeRO-1's reduction; ZeRO-2's is the epilogue's


@pytest.mark.parametrize("stage", [1, 2, 3, "3-whole"])
def test_two_processes_fewer_collectives_same_numbers_bit_for_bit(two_process_runs, stage):
    """On two processes DeepSpeed all-reduces each parameter group's norm (ZeRO-1/2; ZeRO-3 too, left as DeepSpeed
    does it) and gathers each group's updated weights (ZeRO-1/2), and gathers ZeRO-3's persistent parameters one
    collective each after every step; the fast paths do each in one collective. Fewer collectives, the same losses,
    norms and weights."""
    own, fast = two_process_runs[f"zero{stage}-deepspeed"], two_process_runs[f"zero{stage}-fast"]
    assert_same_numbers(own, fast, stage)
    mine, theirs = fast["collectives"], own["collectives"]
    # ZeRO-1/2, 2 groups: per step one all-reduce fewer for the norm (a NaN step's norm too)
    prefix = "zero12" if stage in (1, 2) else "zero3"
    fewer = 4 if stage in (1, 2) and on(fast, "zero12_grouped_norm") else 0
    assert mine["all_reduce"] == theirs["all_reduce"] - fewer, (mine, theirs)
    gather = f"{prefix}_one_param_gather"
    if not on(fast, gather):
        assert mine["all_gather_into_tensor"] == theirs["all_gather_into_tensor"], (mine, theirs)
    elif stage in (1, 2):  # and one gather fewer for the updated weights
        assert mine["all_gather_into_tensor"] == theirs["all_gather_into_tensor"] - 4, (mine, theirs)
    else:  # every persistent parameter had its own gather after each step: one now
        assert mine["all_gather_into_tensor"] < theirs["all_gather_into_tensor"] - 4 * 10, (mine, theirs)


def test_zero3_with_every_tensor_whole_runs_without_module_hooks(runs):
    """On a world of one with every parameter persistent, ZeRO-3's per-module hooks are replaced by one root hook
    (the numbers are the bit-for-bit test's "3-whole"); with partitioned weights they all stay."""
    assert runs["zero3-whole-fast"]["module_hooks"] == 1 < runs["zero3-whole-deepspeed"]["module_hooks"]
    assert runs["zero3-fast"]["module_hooks"] == runs["zero3-deepspeed"]["module_hooks"] > 1
    assert runs["zero3-whole-fast"]["calls"]["zero3_whole_module_hooks"] == 1  # once, when the engine is made


def test_zero3_with_every_tensor_whole_keeps_them_whole_through_each_step(runs, two_process_runs):
    """DeepSpeed releases every parameter at each step's start and gathers them back at its end; with every tensor
    persistent they stay and are refreshed in place (the numbers are the bit-for-bit tests' "3-whole", whose NaN
    second step is skipped before the refresh). With partitioned weights DeepSpeed's release stays."""
    for results in (runs, two_process_runs):
        own, fast = results["zero3-whole-deepspeed"], results["zero3-whole-fast"]
        assert (own["releases"], fast["releases"]) == (4, 0), (own["releases"], fast["releases"])
        assert all(fast["calls"][name] == 4 for name in WHOLE_THROUGH_STEP[:2]), fast["calls"]
        assert fast["calls"][WHOLE_THROUGH_STEP[2]] == 3, fast["calls"]  # the skipped step ends before it
        assert results["zero3-fast"]["releases"] == results["zero3-deepspeed"]["releases"] == 4
