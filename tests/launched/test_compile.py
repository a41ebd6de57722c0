"""`--torch_compile` on the plain Trainer, through the recipe in a real process (CPU). Every 2-process engine (DDP,
ZeRO-2, ZeRO-3, FSDP2) is checked the same way in test_conformance.py's compiled arm, on the runs it resumes.

The test reads what happened from the run's throughput.json, whose `compile` section comes from dynamo's counters
on every rank (`throughput.compilation`), not from the flag: every rank compiled the engine's number of graphs
(tests/helpers/compile_checks.py, GRAPHS_PER_RANK) inside its training steps, none after the warm-up steps (a fixed
shape), and the compile time fell inside the warm-up the steady-state figures leave out. A graph count alone would
take an input hook's graph for the model's (the device transforms compile as a graph of their own), so the recipe
runs through tests/launched/workers/compile_probe.py, which records on every rank the frames dynamo compiled: the
object the loop trains is compiled, and a graph was traced from the model's forward (its code, or a resume of it
after a graph break). Its 4 losses are finite and match an eager run of the same seed and data.

The backend is `aot_eager`: dynamo's capture and AOTAutograd's forward/backward graphs, the part that meets each
engine's wrappers and hooks (DDP's bucketed graphs, DeepSpeed's ZeRO-3 gather hooks, FSDP2's), without inductor's
C++ code generation, which is the same under every engine and cost 11-83 s per run here (2 cores). Measured with
`inductor` (this file with BACKEND = "inductor", 9.7 min): largest relative loss drift from eager over the 4 steps
1.0e-7 under every engine (float32 rounding), graphs per rank plain 2, DDP 2, ZeRO-2 2, ZeRO-3 22, FSDP2 5, none
after warm-up. With `aot_eager` the logged losses equal eager's exactly (drift 0, every engine). Inductor under DDP
with the device input path: test_gpu_path_flags.py.

Cost: 4 steps of the tiniest preset (vit-tiny-cpu at 16 px); one compile cache for the session (shared by
pytest-xdist's workers).
"""

import math
import os

import pytest

from hf_vit_scaling.throughput.schema import load_throughput_report
from tests.helpers.compile_checks import assert_compiled_on_every_rank
from tests.helpers.launchers import WORKERS, logged_losses, read_json, run_recipe

STEPS = 4
RUN_ARGS = ["--max_steps", str(STEPS), "--logging_steps", "1", "--eval_strategy", "no", "--max_eval_samples", "16",
            "--random_resized_crop", "false"]  # fmt: skip
ENGINES = {"plain": ("python", 1, [])}  # name: (launcher, processes, engine flags)
BACKEND = "aot_eager"
LOSS_TOLERANCE = 1e-5  # relative, per step: 100x the drift measured under inductor (module docstring)


@pytest.fixture(scope="session")
def inductor_cache(tmp_path_factory) -> str:
    """One inductor cache for the session; under pytest-xdist the workers share it (their base temp's parent)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER") is not None:
        root = root.parent
    folder = root / "inductor_cache"
    folder.mkdir(parents=True, exist_ok=True)
    return str(folder)


class EagerLosses(dict):
    """{processes: the 4 losses of the eager run}: 1 process (plain); made on first use."""

    def __init__(self, tmp_path_factory):
        super().__init__()
        self.tmp_path_factory = tmp_path_factory

    def __missing__(self, nproc: int) -> list[float]:
        out = self.tmp_path_factory.mktemp(f"eager_{nproc}")
        run_recipe(out, *RUN_ARGS, launcher="python" if nproc == 1 else "torchrun", nproc=nproc)
        self[nproc] = logged_losses(out)
        return self[nproc]


@pytest.fixture(scope="module")
def eager_losses(tmp_path_factory) -> EagerLosses:
    return EagerLosses(tmp_path_factory)


def compiled_run(name, tmp_path, inductor_cache) -> tuple[dict, list[dict], list[float], int]:
    """(the run's compile facts from throughput.json, each rank's compiled frames from the probe, its losses, its
    process count). The recipe runs through tests/launched/workers/compile_probe.py, which records per rank, at the
    end of training, the frames dynamo compiled and whether each was traced from the model's forward."""
    launcher, nproc, flags = ENGINES[name]
    probe = tmp_path / "compile_probe"
    run_recipe(tmp_path, "--torch_compile_backend", BACKEND, *flags, *RUN_ARGS, launcher=launcher, nproc=nproc,
               script=WORKERS / "compile_probe.py", TORCHINDUCTOR_CACHE_DIR=inductor_cache,
               COMPILE_PROBE_DIR=str(probe))  # fmt: skip
    report = load_throughput_report(str(tmp_path / "throughput.json"))
    ranks = [read_json(probe / f"rank{rank}.json") for rank in range(nproc)]
    return report["compile"], ranks, logged_losses(tmp_path), nproc


def check_compiled_and_exact(name, tmp_path, inductor_cache, eager_losses) -> None:
    facts, ranks, losses, nproc = compiled_run(name, tmp_path, inductor_cache)
    assert_compiled_on_every_rank(name, facts, ranks)
    assert facts["compile_time_s"] > 0 and facts["warmup_time_s"] >= facts["compile_time_s"] * 0.5, facts
    assert len(losses) == STEPS and all(math.isfinite(loss) for loss in losses), losses
    assert losses == pytest.approx(eager_losses[nproc], rel=LOSS_TOLERANCE), (losses, eager_losses[nproc])


def test_plain_trainer_one_process_compiles(tmp_path, inductor_cache, eager_losses):
    """Fails if the plain Trainer's model is not compiled under --torch_compile (e.g. accelerate's compile and
    `CompileEngine`'s both skipped: the flag accepted, dynamo's counters at zero), recompiles after warm-up, or
    trains other losses than eager."""
    check_compiled_and_exact("plain", tmp_path, inductor_cache, eager_losses)
