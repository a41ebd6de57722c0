"""The GPU check's settings (`Settings`, one per run), its engines and the time each item may take; constants of the
built-in data. Part of benchmarks/gpu_check.py."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
NEEDED_MODULES = ("deepspeed", "datasets", "evaluate")  # the GPU image has torch, transformers, accelerate, ...
DIGITS_ROWS = 1797  # scikit-learn's digits, the recipe's built-in dataset
TRAIN_FRACTION = 0.85  # the recipe carves --train_val_split 0.15 out of a source with no validation split
DATA_WAIT_TARGET = 0.05
DIGITS_LABELS = [str(digit) for digit in range(10)]


@dataclass(frozen=True)
class Engine:
    name: str  # hf_vit_scaling.planning.shapes.ENGINES, or benchmarks/engine_overhead.py's CONFIGS for "auto" arms
    label: str
    ds_config: str | None  # a file in ds_configs/
    flags: tuple[str, ...]
    processes: int
    # transformers' own fill of the model-sized DeepSpeed values, written as numbers into a copy of `ds_config`
    # (benchmarks/engine_overhead.py's auto_config): the run as it was before the project resolved them.
    auto: bool = False
    # The project's resolved values with DeepSpeed's own per-tensor loops (the fast paths off): what the fast paths
    # add on a GPU, read against the same engine's run with them.
    own: bool = False

    @property
    def planner_engine(self) -> str:
        return self.name.removesuffix("_auto").removesuffix("_own")

    @property
    def fast_paths_off(self) -> bool:
        """The "auto" arms (the run before the project's changes) and the "own" arms run DeepSpeed's own code."""
        return self.auto or self.own


# In the order their eager runs go (gpu_check.item_order): the project's resolved values first, the "auto" arms
# after them, as the before-resolution baseline.
ENGINES = (
    Engine("ddp", "plain Trainer", None, (), 1),
    Engine("zero2", "ZeRO-2", "zero2.json", (), 1),
    Engine("zero3", "ZeRO-3", "zero3.json", (), 1),
    Engine("zero1", "ZeRO-1", "zero1.json", (), 1),
    # FSDP2 shards over the processes of a distributed run: the recipe refuses 1 process (arguments/checks.py).
    Engine("fsdp2", "FSDP2", None, ("--fsdp", "--fsdp_config", str(REPO / "fsdp_configs" / "fsdp2.json")), 2),
    Engine("zero2_auto", 'ZeRO-2 "auto"', "zero2.json", (), 1, auto=True),
    Engine("zero3_auto", 'ZeRO-3 "auto"', "zero3.json", (), 1, auto=True),
    Engine("zero2_own", "ZeRO-2, fast paths off", "zero2.json", (), 1, own=True),
    Engine("zero3_own", "ZeRO-3, fast paths off", "zero3.json", (), 1, own=True),
)
ENGINE = {engine.name: engine for engine in ENGINES}
PROFILED = ("floor", "ddp", "zero2")  # the profiler item's runs, in order
MAX_AUTOTUNE = "max-autotune-no-cudagraphs"  # the plain Trainer's last arm (GPU only)


@dataclass(frozen=True)
class Settings:
    """What one mode runs. Sizes on the GPU: a ViT-B/16 step at batch 128 takes milliseconds, so the steps cost
    seconds; each run's start (imports, model, DeepSpeed) and each compile cost the rest (measured: docs/gpu.md,
    "Where the check's time goes")."""

    dry_run: bool
    model_preset: str
    image_size: int
    batch_size: int
    precision: str
    eager_steps: int
    eager_warmup: int
    compiled_steps: int
    compiled_warmup: int  # the first step compiles; the few after can recompile
    workers: int
    shard_size: int  # stored side: 256 for 224 px training (docs/prepare.md)
    prepare_procs: int
    floor_steps: int
    floor_warmup: int
    compiled_engines: tuple[str, ...]
    # torch.compile's backend. The dry run's aot_eager traces with dynamo and AOT autograd as inductor does, without
    # the code generation (C++ on a CPU, which the GPU does not run anyway, and most of a CPU compile's time:
    # docs/gpu.md, "Where the check's time goes").
    compile_backend: str
    # The profiler item (benchmarks/gpu_check_profile.py): steps run before the profiled ones, and those profiled.
    profile_warmup: int
    profile_steps: int
    # The plain Trainer compiled with --torch_compile_mode MAX_AUTOTUNE: inductor's GEMM autotuning is GPU work.
    max_autotune: bool
    budget_s: float
    # (expected, limit) seconds per kind of item: an item starts only with its expected time left in the budget,
    # and runs at most its limit (or what is left of the budget).
    times: dict


GPU = Settings(
    dry_run=False,
    model_preset="vit-b-16",
    image_size=224,
    batch_size=128,
    precision="bf16",
    eager_steps=80,
    eager_warmup=20,
    compiled_steps=100,
    compiled_warmup=30,
    workers=8,
    shard_size=256,
    prepare_procs=8,
    floor_steps=50,
    floor_warmup=10,
    compiled_engines=("ddp", "zero2", "zero3", "zero1", "fsdp2"),
    compile_backend="inductor",
    profile_warmup=10,
    profile_steps=5,
    max_autotune=True,
    # 9 minutes, less what comes outside the clock: make and Python start-up before it, a timed-out item's stop
    # (stop_group's waits: up to 10 + 5 = 15 s) and the writing after it.
    budget_s=515,
    # Expected times from the one H200 run, each recipe run from its command to its done line, without the wait at
    # exit that run had (persistent loader workers; fixed since: VitTrainer.release_loader_workers). The measured
    # times: docs/gpu.md, "Where the check's time goes".
    # The profiler item's and the max-autotune arm's are estimates, not yet measured: the profile is three short
    # runs (the floor's process and two recipe starts, each a run's start-up and a few steps), the max-autotune arm
    # the compiled run's time and inductor's GEMM autotuning.
    times={
        "setup": (30, 180),
        "shards": (35, 150),
        "eager": (35, 120),
        "eager-zero3": (50, 150),
        "eager-zero3_auto": (50, 150),
        "eager-zero3_own": (50, 150),  # an estimate: ZeRO-3's, its fast paths off
        "floor": (65, 200),
        "compiled": (70, 200),
        "compiled-zero3": (90, 240),
        "compiled-max-autotune": (150, 300),
        "profile": (85, 240),
        "planner-grid": (35, 150),
    },
)
DRY_RUN = Settings(
    dry_run=True,
    model_preset="vit-tiny-cpu",
    image_size=16,
    batch_size=16,
    precision="fp32",
    # As few steps as show every arm working (CI runs it): a median over the steps after the warm-up, a compiled
    # run's recompiles inside its warm-up.
    eager_steps=5,
    eager_warmup=2,
    compiled_steps=6,
    compiled_warmup=3,
    workers=1,
    shard_size=16,
    prepare_procs=1,
    floor_steps=8,
    floor_warmup=3,
    # One compiled run: the others differ from it only by the engine flags, which their eager runs check, and each
    # compile is costly on a 2-core CPU (docs/gpu.md, "Where the check's time goes").
    compiled_engines=("ddp",),
    compile_backend="aot_eager",
    profile_warmup=1,
    profile_steps=2,
    max_autotune=False,
    # A cap, not the target (the dry run's time on 2 idle cores: docs/gpu.md, "Where the check's time goes"): on a
    # loaded CI machine, or where DeepSpeed builds its CPU op for the first time, the same items take longer and must
    # still all run.
    budget_s=1200,
    times={
        "setup": (5, 60),
        "shards": (10, 60),
        # The first DeepSpeed run on a machine JIT-builds DeepSpeed's CPU shared-memory op (its time:
        # ds_configs/README.md, "CPU ops"), cached in ~/.cache/torch_extensions after.
        "eager": (10, 120),
        "eager-fsdp2": (20, 120),
        "floor": (30, 150),
        "compiled": (35, 150),
        "profile": (30, 180),
        "planner-grid": (0, 0),
    },
)


def item_times(settings: Settings, kind: str, key: str | None = None) -> tuple[float, float]:
    return settings.times.get(f"{kind}-{key}", settings.times[kind])


def item_order() -> list[str]:
    """Every item after setup, in the order they run: the figures that matter most first, so what a short budget
    skips is the end of the list. The plain Trainer eager, the floor and the plain Trainer compiled (the floor
    ratios, part b's data wait), the other engines eager with the project's resolved values, the profile, the
    "auto" arms (transformers' fill: the baseline of the resolution), the engines compiled, the planner's memory
    grid, and last the plain Trainer compiled with max-autotune."""
    resolved = [engine.name for engine in ENGINES if not engine.fast_paths_off]
    auto = [engine.name for engine in ENGINES if engine.fast_paths_off]  # the baselines: "auto", then "own"
    return [
        "shards",
        "ddp-eager",
        "floor",
        "ddp-compiled",
        *(f"{name}-eager" for name in resolved[1:]),
        "profile",
        *(f"{name}-eager" for name in auto),
        *(f"{name}-compiled" for name in resolved[1:]),
        "planner-grid",
        "ddp-max-autotune",
    ]


def item_kind(name: str) -> tuple[str, str | None]:
    """The (kind, key) of an item's times in Settings.times."""
    if name.endswith("-max-autotune"):
        return "compiled", "max-autotune"
    engine, _, variant = name.rpartition("-")
    if variant in ("eager", "compiled") and engine in ENGINE:
        return variant, engine
    return name, None


def runs_here(settings: Settings, engine: Engine) -> bool:
    """Whether this machine can run the engine: a multi-process engine needs a GPU per process (NCCL runs one rank
    per GPU); the dry run starts its processes on the CPU."""
    return settings.dry_run or engine.processes <= torch.cuda.device_count()


def shard_copies(settings: Settings) -> int:
    """Copies of the digits that give every run its steps within one epoch (the largest run: its steps x batch x
    processes training rows)."""
    steps = max(settings.eager_steps, settings.compiled_steps)
    processes = max(engine.processes for engine in ENGINES if runs_here(settings, engine))
    return math.ceil(steps * settings.batch_size * processes / math.floor(DIGITS_ROWS * TRAIN_FRACTION))
