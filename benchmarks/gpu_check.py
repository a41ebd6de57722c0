#!/usr/bin/env python
"""Every GPU measurement of this project in one run of at most 9 minutes on one H200; with --dry_run, the same code
path on the CPU with a tiny model in a few steps (CI runs it, so the script cannot rot). docs/gpu.md has the how-to.

    make gpu-check OUT=outputs/gpu-check               # the GPU machine (its python3; no `make install` needed)
    make gpu-check OUT=outputs/gpu-check-dry DRY_RUN=1  # anywhere: vit-tiny-cpu at 16 px, fp32, DS_ACCELERATOR=cpu

What runs, in this order. Each item is its own process with its own time limit, all under one total budget: an item
that no longer fits is skipped and named, and a failed item never stops the next.

  setup   deepspeed, datasets and evaluate installed from .whl/ (../shared/tools/device-wheels) into /tmp/site when
          they are missing (never downloaded);
  b       prepared shards: the built-in digits, repeated until every run's steps fit in one epoch (an epoch boundary
          restarts the loader and would count as data wait), written by recipes/prepare_shards.py as uint8 RGB shards
          at 256 px (16 in the dry run);
  a       recipes/train_vit.py (benchmarks/gpu_vit_b16.py's cell command) on those shards with loader workers,
          ViT-B/16 at 224 px in bf16: the plain Trainer (1 process, no DDP wrapper), ZeRO-2, ZeRO-3 and FSDP2 (2+
          processes: not applicable on one GPU), each eager and with --torch_compile true. Figures from each run's
          throughput.json, peak memory beside the planner's prediction (benchmarks/planner_memory_gpu.py's);
  c       the synthetic floor: the same model and precision in a plain torch loop (forward, backward, clipping, AdamW
          step) on one batch already on the device, eager and compiled; every run's step time / the floor's;
  d       benchmarks/planner_memory_gpu.py's grid (GPU only, when time is left).
  Part b's figure is the compiled plain-Trainer run of part a: data wait below 5% of the step at the compiled step
  rate, the fastest the loader must keep up with.

Order of the items: setup, shards, plain Trainer eager, floor, plain Trainer compiled (a and b), then the other
engines eager, then compiled, then d: the figures that matter most come first.

Writes OUT/gpu_check.json (after every item, so a killed run leaves what it had), OUT/gpu_check.md (the table for
benchmarks/README.md), OUT/runs/<item>/ (each run's output folder and its log, weights deleted) and OUT/runs.tar.gz
(the same folders packed: on the GPU machine the folders are removed after packing, since at most 8 files come back
from it). Exit code 0 when every item that should run ran (a missed target such as the data wait is a finding, not
a failure), 1 when one failed or ran out of time, 2 for a bad command line; always after every item had its turn.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from torch.distributed.elastic.utils.distributed import get_free_port

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
NEEDED_MODULES = ("deepspeed", "datasets", "evaluate")  # the GPU image has torch, transformers, accelerate, ...
DIGITS_ROWS = 1797  # scikit-learn's digits, the recipe's built-in dataset
TRAIN_FRACTION = 0.85  # the recipe carves --train_val_split 0.15 out of a source with no validation split
DATA_WAIT_TARGET = 0.05
DIGITS_LABELS = [str(digit) for digit in range(10)]


@dataclass(frozen=True)
class Engine:
    name: str  # hf_vit_scaling.planning.shapes.ENGINES
    label: str
    ds_config: str | None  # a file in ds_configs/
    flags: tuple[str, ...]
    processes: int


ENGINES = (
    Engine("ddp", "plain Trainer", None, (), 1),
    Engine("zero2", "ZeRO-2", "zero2.json", (), 1),
    Engine("zero3", "ZeRO-3", "zero3.json", (), 1),
    # FSDP2 shards over the processes of a distributed run: the recipe refuses 1 process (arguments/checks.py).
    Engine("fsdp2", "FSDP2", None, ("--fsdp", "--fsdp_config", str(REPO / "fsdp_configs" / "fsdp2.json")), 2),
)


@dataclass(frozen=True)
class Settings:
    """What one mode runs. Sizes on the GPU: ViT-B/16 eager at ~2,500 images/s is ~50 ms a step at batch 128, so
    the steps cost seconds; each run's start (imports, model, DeepSpeed) and each compile (~1 min) cost the rest."""

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
    # the code generation (C++ on a CPU, which the GPU does not run anyway: 36 s for the tiny floor model here, 1 s
    # with aot_eager).
    compile_backend: str
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
    compiled_engines=("ddp", "zero2", "zero3", "fsdp2"),
    compile_backend="inductor",
    # 9 minutes, less what comes outside the clock: make and Python start-up before it, a timed-out item's stop (up
    # to 15 s) and the writing after it.
    budget_s=515,
    times={
        "setup": (30, 180),
        "shards": (30, 150),
        "eager": (35, 120),
        "eager-zero3": (45, 150),
        "floor": (90, 200),
        "compiled": (100, 200),
        "compiled-zero3": (120, 240),
        "planner-grid": (60, 150),
    },
)
DRY_RUN = Settings(
    dry_run=True,
    model_preset="vit-tiny-cpu",
    image_size=16,
    batch_size=16,
    precision="fp32",
    eager_steps=10,
    eager_warmup=2,
    compiled_steps=10,
    compiled_warmup=3,
    workers=1,
    shard_size=16,
    prepare_procs=1,
    floor_steps=20,
    floor_warmup=3,
    # One compiled run: the others differ from it only by the engine flags, which their eager runs check, and each
    # compile costs ~30 s of a 2-core CPU.
    compiled_engines=("ddp",),
    compile_backend="aot_eager",
    # A cap, not the target (about 2 minutes on 2 idle cores): on a loaded CI machine, or where DeepSpeed builds
    # its CPU op for the first time, the same items take longer and must still all run.
    budget_s=420,
    times={
        "setup": (5, 60),
        "shards": (10, 60),
        # The first DeepSpeed run on a machine JIT-builds DeepSpeed's CPU shared-memory op (~20 s of g++), cached
        # in ~/.cache/torch_extensions after.
        "eager": (10, 90),
        "eager-fsdp2": (20, 90),
        "floor": (30, 90),
        "compiled": (35, 120),
        "planner-grid": (0, 0),
    },
)


def item_times(settings: Settings, kind: str, key: str | None = None) -> tuple[float, float]:
    return settings.times.get(f"{kind}-{key}", settings.times[kind])


# --------------------------------------------------------------------------- the synthetic floor


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_step(
    model: torch.nn.Module,
    precision: str,
    compile_model: bool = False,
    max_grad_norm: float = 1.0,
    lr: float = 1e-4,
    backend: str = "inductor",
):
    """One training step of a Hugging Face image classifier as the Trainer runs it without DeepSpeed: forward with
    labels under autocast for bf16 (fp32 weights, as the Trainer runs bf16 without DeepSpeed), backward, gradient
    clipping at `max_grad_norm` (the Trainer's default 1.0; 0 skips it), fused AdamW (the Trainer's default
    `adamw_torch_fused` on torch >= 2.8, CPU and CUDA alike), zero_grad(set_to_none=True). With `compile_model`:
    torch.compile with `backend` (the first call compiles). Returns step(pixels, labels)."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)
    forward = torch.compile(model, backend=backend) if compile_model else model
    device_type = next(model.parameters()).device.type

    def step(pixels: torch.Tensor, labels: torch.Tensor) -> None:
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = forward(pixel_values=pixels, labels=labels).loss
        loss.backward()
        if max_grad_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def time_steps(step, batch: tuple[torch.Tensor, torch.Tensor], steps: int, warmup: int) -> dict:
    """Runs `step(*batch)` `warmup` times (timed apart: compiles happen there), then `steps` times, each timed from
    the previous step's end (the device synchronised) to its own, as the recipe's throughput report times the time
    between consecutive step ends. CUDA: peak allocated bytes over the timed steps too. Returns step_s (mean),
    step_s_median, steps_per_s, images_per_s, warmup_s, peak_allocated_bytes (None off CUDA)."""
    pixels = batch[0]
    device = pixels.device
    start = time.perf_counter()
    for _ in range(warmup):
        step(*batch)
    _sync(device)
    warmup_s = time.perf_counter() - start
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    ends = [time.perf_counter()]
    for _ in range(steps):
        step(*batch)
        _sync(device)
        ends.append(time.perf_counter())
    deltas = sorted(b - a for a, b in zip(ends, ends[1:]))
    elapsed = ends[-1] - ends[0]
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return {
        "steps": steps,
        "warmup_steps": warmup,
        "step_s": elapsed / steps,
        "step_s_median": deltas[len(deltas) // 2],
        "steps_per_s": steps / elapsed,
        "images_per_s": steps * pixels.shape[0] / elapsed,
        "warmup_s": warmup_s,
        "peak_allocated_bytes": peak,
    }


def synthetic_floor(
    model: torch.nn.Module,
    batch: tuple[torch.Tensor, torch.Tensor],
    steps: int,
    warmup: int,
    precision: str,
    compile_model: bool = False,
    max_grad_norm: float = 1.0,
    lr: float = 1e-4,
    backend: str = "inductor",
) -> dict:
    """Steps/s of the bare training step of a Hugging Face image classifier (`plain_step`): no loader, no callbacks,
    no Trainer. `batch` is (pixel_values, labels), already on the model's device; the same batch every step. See
    `time_steps` for what is returned."""
    return time_steps(plain_step(model, precision, compile_model, max_grad_norm, lr, backend), batch, steps, warmup)


def floor_main(settings: Settings, out_json: str) -> int:
    """The floor item's own process: the recipe's model from its preset, eager then compiled, each on a fresh model
    and optimizer (so each peak is its own), with MFU against the same peak the recipe's report uses."""
    from planner_memory_gpu import load_planner, predict

    planner = load_planner()  # also the presets, without the package's loader (which imports deepspeed)
    models = planner[2]
    flops = importlib.import_module("hf_vit_scaling.models.flops")
    device = torch.device("cpu" if settings.dry_run else "cuda")
    config = models.preset_config(settings.model_preset, DIGITS_LABELS, image_size=settings.image_size)
    peak_tflops, peak_source = flops.device_peak_tflops(device, settings.precision)
    train_flops = flops.vit_train_flops_per_image(config)
    predicted = predict(planner, settings.model_preset, settings.image_size, settings.batch_size, settings.precision)
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "peak_tflops": peak_tflops,
        "peak_source": peak_source,
        "train_flops_per_image": train_flops,
        "predicted_peak_bytes": predicted["peak"],
    }
    failed = False
    for compiled in (False, True):
        variant = "compiled" if compiled else "eager"
        try:
            torch.manual_seed(0)
            model = models.build_model_from_preset(config).to(device)
            pixels = torch.randn(settings.batch_size, 3, settings.image_size, settings.image_size, device=device)
            labels = torch.randint(0, len(DIGITS_LABELS), (settings.batch_size,), device=device)
            run = synthetic_floor(model, (pixels, labels), settings.floor_steps, settings.floor_warmup,
                                  settings.precision, compiled, backend=settings.compile_backend)  # fmt: skip
            achieved = run["images_per_s"] * train_flops / 1e12
            run["mfu"] = achieved / peak_tflops if peak_tflops else None
        except Exception as err:  # a failed compile must not lose the eager figures: recorded, the item fails
            failed, run = True, {"error": repr(err)[-2000:]}
        result[variant] = run
        print(f"floor {variant}: {json.dumps(run)}", flush=True)
        # Written after each variant: if the compile outlasts the item's limit, the eager figures are kept.
        Path(out_json).write_text(json.dumps(result, indent=2))
        model = pixels = labels = None  # free the device memory before the next variant
        torch._dynamo.reset()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return 1 if failed else 0


def source_main(folder: str, copies: int) -> int:
    """The shards item's first process: the built-in digits repeated `copies` times as a save_to_disk folder, the
    source recipes/prepare_shards.py then reads (--dataset_name)."""
    from datasets import DatasetDict, concatenate_datasets

    from hf_vit_scaling.data.sources import builtin_digits

    train = builtin_digits()["train"]
    DatasetDict(train=concatenate_datasets([train] * copies)).save_to_disk(folder)
    print(f"source: {copies} x {len(train)} digits rows in {folder}", flush=True)
    return 0


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


# --------------------------------------------------------------------------- processes, packages, budget


class Clock:
    def __init__(self, budget_s: float):
        self.start = time.monotonic()
        self.budget_s = budget_s

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return self.budget_s - self.elapsed()


def log_tail(path: Path, lines: int = 25, chars: int = 2500) -> str:
    """The end of a log; its `error:` lines when it has any (the recipe's one-line user errors)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    errors = [line for line in text if line.startswith("error:")]
    return "\n".join(errors or text[-lines:])[-chars:]


def stop_group(proc: subprocess.Popen) -> None:
    """End a timed-out command and everything it started (torchrun's workers, loader workers): its process group,
    which it leads (start_new_session), TERM first so torchrun can stop its workers, then KILL."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_process(cmd: list, log: Path, timeout: float) -> tuple[str, int | None]:
    """Run `cmd` from the repository root with its output appended to `log`: ("ok" | "failed" | "timeout", rc)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", encoding="utf-8") as out:
        out.write("$ " + " ".join(str(c) for c in cmd) + "\n")
        out.flush()
        proc = subprocess.Popen(
            [str(c) for c in cmd], cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            stop_group(proc)
            out.write(f"\n[gpu_check] stopped after its limit of {timeout:.0f} s\n")
            return "timeout", None
    return ("ok" if rc == 0 else "failed"), rc


def prepend_pythonpath(*paths) -> None:
    """Children import this checkout's package (the GPU machine has it installed nowhere) and the installed wheels:
    PYTHONPATH, which the recipe's processes and torchrun's workers inherit."""
    current = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    new = [str(p) for p in paths]
    os.environ["PYTHONPATH"] = os.pathsep.join(new + [p for p in current if p not in new])
    for path in reversed(new):
        if path not in sys.path:
            sys.path.insert(0, path)


def ensure_packages(wheels: Path, site: Path, modules=NEEDED_MODULES) -> dict:
    """Install the wheels in `wheels` into `site` when one of `modules` cannot be imported, as the GPU machine's
    documented line does (pip --no-index: nothing is downloaded), and make them importable here and in children."""
    start = time.monotonic()
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    result = {"missing": missing, "wheels": str(wheels), "site": None}
    if not missing:
        return {**result, "status": "ok", "note": f"{', '.join(modules)} already importable: nothing installed"}
    found = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    if not found:
        return {
            **result,
            "status": "failed",
            "error": f"{', '.join(missing)} missing and no wheels in {wheels}. Fix: run ../shared/tools/device-wheels "
            "in the project root before the device call, and carry .whl.",
        }
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
           "--upgrade", "--target", str(site), *found]  # fmt: skip
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    result.update(site=str(site), installed=[w.name for w in found], seconds=round(time.monotonic() - start, 1))
    if proc.returncode != 0:
        return {**result, "status": "failed", "error": (proc.stdout + proc.stderr)[-2500:]}
    prepend_pythonpath(site)
    importlib.invalidate_caches()
    still = [m for m in modules if importlib.util.find_spec(m) is None]
    if still:
        return {**result, "status": "failed", "error": f"installed, yet {', '.join(still)} cannot be imported"}
    return {**result, "status": "ok"}


def set_child_env(settings: Settings) -> None:
    """What every child process gets (set once in this process's environment, which they inherit): no launcher's
    leftovers (a 1-process run would wait for a world), offline (the GPU machine reaches nothing, and a Hub lookup
    would wait for its timeouts), no FutureWarnings (ZeRO-3 prints one per step, a deprecated torch collective inside
    DeepSpeed, which buries the logs)."""
    from hf_vit_scaling.utils import OFFLINE, child_env  # this checkout's: prepend_pythonpath(REPO) ran first

    cpu = {"DS_ACCELERATOR": "cpu"} if settings.dry_run else {}
    env = child_env(**OFFLINE, TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1",
                    PYTHONWARNINGS="ignore::FutureWarning", **cpu)  # fmt: skip
    os.environ.clear()
    os.environ.update(env)


# --------------------------------------------------------------------------- the items


class Check:
    """The run: its items' results, written to OUT/gpu_check.json after every item."""

    def __init__(self, settings: Settings, out: Path, only: set[str] | None):
        self.settings = settings
        self.out = out
        self.runs = out / "runs"
        self.only = only
        self.clock = Clock(settings.budget_s)
        self.items: dict[str, dict] = {}
        self.setup: dict = {}
        self.planner = None
        self.shards: Path | None = None

    # ----- bookkeeping

    def wanted(self, name: str) -> bool:
        return self.only is None or name in self.only

    def begin(self, name: str, part: str, kind: str, times_key: str | None = None, **info) -> float | None:
        """The item's time limit, or None when it is skipped (recorded): not asked for, or no time left. `kind` and
        `times_key` pick its times in Settings.times."""
        expect, cap = item_times(self.settings, kind, times_key)
        record = {"part": part, "status": "skipped", "seconds": 0.0, **info}
        self.items[name] = record
        if not self.wanted(name):
            record["reason"] = "not in --only"
            return None
        left = self.clock.left()
        if left < max(expect, 1):
            record.update(reason=f"budget: {left:.0f} s left of {self.settings.budget_s:.0f}, needs ~{expect} s",
                          budget_skipped=True)  # fmt: skip
            print(f"[{self.clock.elapsed():5.0f} s] {name}: skipped ({record['reason']})", flush=True)
            return None
        print(f"[{self.clock.elapsed():5.0f} s] {name}: start (limit {min(cap, left):.0f} s)", flush=True)
        return min(cap, left)

    def finish(self, name: str, status: str, started: float, **fields) -> dict:
        record = self.items[name]
        record.update(status=status, seconds=round(time.monotonic() - started, 1), **fields)
        note = record.get("error", "").splitlines()[-1:] if status != "ok" else []
        print(f"[{self.clock.elapsed():5.0f} s] {name}: {status} in {record['seconds']:.0f} s"
              + (f" ({note[0][:200]})" if note else ""), flush=True)  # fmt: skip
        self.write()
        return record

    def guarded(self, name: str, part: str, run, *args) -> None:
        """Run one item's method; a bug in this script's own code for it fails that item, not the whole check."""
        try:
            run(*args)
        except Exception:
            import traceback

            record = self.items.setdefault(name, {"part": part, "seconds": 0.0})
            record.update(status="failed", error=traceback.format_exc()[-2500:])
            print(f"[{self.clock.elapsed():5.0f} s] {name}: failed in gpu_check itself\n{record['error']}", flush=True)
            self.write()

    def not_applicable(self, name: str, part: str, reason: str, **info) -> None:
        self.items[name] = {"part": part, "status": "skipped", "seconds": 0.0, "reason": reason, **info}
        print(f"[{self.clock.elapsed():5.0f} s] {name}: skipped ({reason})", flush=True)

    # ----- setup

    def run_setup(self, wheels: Path, site: Path) -> None:
        start = time.monotonic()
        self.setup = ensure_packages(wheels, site)
        self.setup["seconds"] = round(time.monotonic() - start, 1)
        print(f"[{self.clock.elapsed():5.0f} s] setup: {self.setup['status']} "
              f"({self.setup.get('note') or self.setup.get('error') or 'installed from ' + str(wheels)})",
              flush=True)  # fmt: skip
        try:
            from planner_memory_gpu import load_planner

            self.planner = load_planner()
        except Exception as err:  # the engine runs still run; their predictions are then missing
            self.setup["planner_error"] = repr(err)

    # ----- b: the prepared shards

    def run_shards(self, scratch: Path) -> None:
        name = "shards"
        limit = self.begin(name, "b", "shards", size=self.settings.shard_size, copies=shard_copies(self.settings))
        if limit is None:
            return
        start, log = time.monotonic(), self.runs / name / "gpu_check.log"
        source, shards = scratch / "source", scratch / "shards"
        for path in (source, shards):
            shutil.rmtree(path, ignore_errors=True)
        copies = self.items[name]["copies"]
        cmd = [sys.executable, __file__, *self.child_args(), "--source_dir", source, "--source_copies", copies]
        status, _ = run_process(cmd, log, limit)
        if status == "ok":
            status, _ = run_process(
                [sys.executable, REPO / "recipes" / "prepare_shards.py", "--dataset_name", source, "--output_dir",
                 shards, "--size", self.settings.shard_size, "--channels", "3",
                 "--num_proc", self.settings.prepare_procs],
                log, limit - (time.monotonic() - start),
            )  # fmt: skip
        if status == "ok":
            self.shards = shards
            manifest = json.loads((shards / "manifest.json").read_text())
            rows = sum(shard["rows"] for shard in manifest["splits"]["train"])
            self.finish(name, status, start, rows=rows, folder=str(shards))
        else:
            self.finish(name, status, start, error=log_tail(log))

    # ----- a: the recipe runs

    def run_engine(self, engine: Engine, compiled: bool) -> None:
        s = self.settings
        name = f"{engine.name}-{'compiled' if compiled else 'eager'}"
        info = {"engine": engine.name, "label": engine.label, "compiled": compiled, "processes": engine.processes}
        if compiled and engine.name not in s.compiled_engines:
            reason = (
                "dry run: only the plain Trainer runs compiled (a compile costs ~30 s of CPU); the engine flags are "
                "checked eager"
            )
            return self.not_applicable(name, "a", reason, **info)
        if not runs_here(s, engine):
            reason = (f"not applicable: {engine.label} shards over {engine.processes}+ processes in this recipe "
                      f"(arguments/checks.py check_fsdp) and this machine has {torch.cuda.device_count()} GPU "
                      "(NCCL runs one rank per GPU)")  # fmt: skip
            return self.not_applicable(name, "a", reason, **info)
        limit = self.begin(name, "a", "compiled" if compiled else "eager", engine.name, **info)
        if limit is None:
            return
        from gpu_vit_b16 import cell_command, read_cell

        start, out = time.monotonic(), self.runs / name
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        log = out / "gpu_check.log"
        cell = argparse.Namespace(
            model_preset=s.model_preset, image_size=s.image_size, batch_size=s.batch_size, workers=s.workers,
            steps=s.compiled_steps if compiled else s.eager_steps, bf16=s.precision == "bf16", cpu_smoke=s.dry_run,
            warmup=s.compiled_warmup if compiled else s.eager_warmup,
        )  # fmt: skip
        launcher = None
        if engine.processes > 1:
            from hf_vit_scaling.parallel.launch import launch_command  # this checkout's (on PYTHONPATH by now)

            launcher = launch_command("torchrun", engine.processes, get_free_port())
        cmd = cell_command(cell, engine.ds_config, "device", str(out), launcher)
        # Full batches only: a short last batch has another shape, which a compiled model recompiles for.
        cmd += [*engine.flags, "--dataloader_drop_last", "true"]
        if compiled:
            cmd += ["--torch_compile", "true", "--torch_compile_backend", s.compile_backend]
        info["input"] = "shards" if self.shards else "digits (the shards were not prepared)"
        if self.shards:
            cmd += ["--dataset_name", str(self.shards)]
        status, _ = run_process(cmd, log, limit)
        fields = {"input": info["input"], "steps": cell.steps, "warmup_steps": cell.warmup}
        if status == "ok":
            try:
                fields["figures"] = figures = read_cell(str(out))
                figures["predicted_peak_bytes"] = self.predicted(engine)
                if figures["memory_kind"] == "allocated_peak_bytes" and figures["predicted_peak_bytes"]:
                    figures["memory_error"] = figures["predicted_peak_bytes"] / figures["memory_bytes"] - 1
            except Exception as err:  # a run that exits 0 without a readable report is a failed item
                status, fields["error"] = "failed", f"no readable throughput.json: {err!r}"
        else:
            fields["error"] = log_tail(log)
        drop_weights(out)
        self.finish(name, status, start, **fields)

    def predicted(self, engine: Engine) -> int | None:
        if self.planner is None:
            return None
        from planner_memory_gpu import predict

        ds_configs = self.planner[0].read_ds_configs(str(REPO / "ds_configs"))
        s = self.settings
        return predict(self.planner, s.model_preset, s.image_size, s.batch_size, s.precision, engine=engine.name,
                       world_size=engine.processes, ds_configs=ds_configs)["peak"]  # fmt: skip

    # ----- c: the floor

    def run_floor(self) -> None:
        name = "floor"
        limit = self.begin(name, "c", "floor")
        if limit is None:
            return
        start, out = time.monotonic(), self.runs / name
        out.mkdir(parents=True, exist_ok=True)
        log, result = out / "gpu_check.log", out / "floor.json"
        result.unlink(missing_ok=True)
        status, _ = run_process([sys.executable, __file__, *self.child_args(), "--floor_json", result], log, limit)
        figures = json.loads(result.read_text()) if result.is_file() else None
        errors = [
            f"{v}: {figures[v]['error']}" for v in ("eager", "compiled") if "error" in (figures or {}).get(v, {})
        ]
        if status == "ok":
            self.finish(name, status, start, figures=figures)
        else:  # one variant may have its figures (the other failed)
            self.finish(name, status, start, figures=figures, error="\n".join(errors) or log_tail(log))

    # ----- d: planner_memory_gpu.py's grid

    def run_planner_grid(self) -> None:
        name = "planner-grid"
        if self.settings.dry_run:
            reason = "dry run: benchmarks/planner_memory_gpu.py reads the CUDA allocator's statistics (GPU only)"
            return self.not_applicable(name, "d", reason)
        limit = self.begin(name, "d", "planner-grid")
        if limit is None:
            return
        start, log = time.monotonic(), self.runs / name / "gpu_check.log"
        result = self.out / "planner_memory_gpu.json"
        status, _ = run_process(
            [sys.executable, REPO / "benchmarks" / "planner_memory_gpu.py", "--output", result], log, limit
        )
        if status == "ok":
            rows = json.loads(result.read_text())["rows"]
            self.finish(name, status, start, figures={"file": result.name, "rows": rows})
        else:
            self.finish(name, status, start, error=log_tail(log))

    def child_args(self) -> list[str]:
        return ["--output_dir", str(self.out)] + (["--dry_run"] if self.settings.dry_run else [])

    # ----- results

    def parts(self) -> dict:
        """Per part: status (failed > timeout > ok > skipped over its items), seconds, and whether every item that
        should have run did (`complete`: no item skipped for want of time or by --only)."""
        parts = {}
        for part in ("a", "b", "c", "d"):
            items = {n: r for n, r in self.items.items() if r["part"] == part}
            statuses = {r["status"] for r in items.values()}
            status = next((s for s in ("failed", "timeout", "ok") if s in statuses), "skipped")
            complete = not any(r.get("budget_skipped") or r.get("reason") == "not in --only" for r in items.values())
            seconds = round(sum(r["seconds"] for r in items.values()), 1)
            parts[part] = {
                "status": status,
                "complete": complete,
                "seconds": seconds,
                "items": sorted(items),
                "figures": {n: r["figures"] for n, r in items.items() if r.get("figures")},
                "errors": {n: r["error"] for n, r in items.items() if r.get("error")},
            }
        parts["b"] = self.part_b(parts["b"])
        return parts

    def part_b(self, b: dict) -> dict:
        """Part b is the prepared shards and the compiled plain-Trainer run's data wait on them: when the shards are
        ready, that run's status is b's too."""
        shards, run = self.items.get("shards", {}), self.items.get("ddp-compiled", {})
        b["items"] = ["ddp-compiled", "shards"]
        if shards.get("status") != "ok":
            return b
        figures = run.get("figures")
        if run.get("status") != "ok" or not figures:
            b["status"] = run.get("status", "skipped")
            if run.get("error"):
                b["errors"]["ddp-compiled"] = run["error"]
            b["complete"] = b["complete"] and run.get("status") != "skipped"
            return b
        wait = figures["data_wait_fraction"]
        b["figures"] = {  # the shards' own record holds no figures: b's are the compiled run's data wait
            "run": "ddp-compiled",
            "data_wait_fraction": wait,
            "target": DATA_WAIT_TARGET,
            "passed": wait is not None and wait < DATA_WAIT_TARGET,
            "images_per_s": figures["images_per_s"],
            "step_time_s": figures["step_time_s"],
            "workers": self.settings.workers,
            "shard_size": self.settings.shard_size,
            "rows": shards.get("rows"),
        }
        b["seconds"] = round(b["seconds"] + run["seconds"], 1)
        return b

    def floor_ratios(self) -> None:
        """Each recipe run's mean step time (compute + data wait) / the floor's, eager against eager and compiled
        against compiled; the floor is the plain torch loop, so for ZeRO and FSDP2 the ratio holds their engine's
        own cost too."""
        floor = self.items.get("floor", {}).get("figures")
        if not floor:
            return
        for record in self.items.values():
            figures = record.get("figures")
            variant = floor.get("compiled" if record.get("compiled") else "eager", {})
            if record["part"] == "a" and figures and figures.get("step_time_s") and variant.get("step_s"):
                figures["floor_ratio"] = figures["step_time_s"] / variant["step_s"]

    def result(self) -> dict:
        self.floor_ratios()
        parts = self.parts()
        failed = [p for p, r in parts.items() if r["status"] in ("failed", "timeout")]
        if self.setup.get("status") == "failed":
            failed.append("setup")
        return {
            "mode": "dry_run" if self.settings.dry_run else "gpu",
            "settings": {k: v for k, v in asdict(self.settings).items() if k != "times"},
            "versions": {"python": sys.version.split()[0], "torch": torch.__version__},
            "setup": self.setup,
            "wall_s": round(self.clock.elapsed(), 1),
            "parts": parts,
            "items": self.items,
            "exit_code": 1 if failed else 0,
        }

    def write(self) -> dict:
        result = self.result()
        (self.out / "gpu_check.json").write_text(json.dumps(result, indent=2))
        return result


def drop_weights(folder: Path) -> None:
    """A run's saved model (344 MB for ViT-B/16) is not a measurement: delete it, keep the reports and logs."""
    for pattern in ("*.safetensors", "pytorch_model*.bin", "*.pt"):
        for path in folder.rglob(pattern):
            path.unlink()


# --------------------------------------------------------------------------- the table


def _note(record: dict, default: str = "") -> str:
    """Why an item did not give figures: its skip reason, else its error's last line."""
    lines = (record.get("error") or "").splitlines()
    return (record.get("reason") or (lines[-1] if lines else default))[:160]


def _pct(value) -> str:
    return "" if value is None else f"{value:.1%}"


def _num(value, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


ITEM_ORDER = ["ddp", "zero2", "zero3", "fsdp2"]


def markdown(result: dict) -> str:
    """One table: a row per recipe run (a), the data-wait check (b), the floor (c), the planner grid (d)."""
    s, items, parts = result["settings"], result["items"], result["parts"]
    device = next((r["figures"]["device"] for r in items.values() if r.get("figures", {}).get("device")), "?")
    kinds = [r["figures"]["memory_kind"] for r in items.values() if r.get("figures", {}).get("memory_kind")]
    memory_kind = kinds[0] if kinds else "allocated_peak_bytes"
    lines = [
        f"gpu_check ({result['mode']}) on {device}; torch {result['versions']['torch']}; {s['model_preset']} at "
        f"{s['image_size']} px, batch {s['batch_size']}, {s['precision']}; eager {s['eager_steps']} steps "
        f"({s['eager_warmup']} warm-up excluded), compiled ({s['compile_backend']}) {s['compiled_steps']} "
        f"({s['compiled_warmup']}); prepared "
        f"shards at {s['shard_size']} px with {s['workers']} loader worker(s); wall time {result['wall_s']:.0f} s of "
        f"a {s['budget_s']:.0f} s budget; setup {result['setup'].get('status', '?')}"
        f"{' (' + str(result['setup'].get('seconds')) + ' s)' if result['setup'].get('seconds') else ''}.",
        "",
        "| part | run | status | images/s | MFU | data wait | step ms | x floor | peak GiB (planner) | s | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    kind = "" if memory_kind == "allocated_peak_bytes" else " RSS"
    names = [f"{e}-{v}" for v in ("eager", "compiled") for e in ITEM_ORDER]
    for name in names:
        r = items.get(name)
        if r is None:
            continue
        label = f"{r.get('label', name)} {'compiled' if r.get('compiled') else 'eager'}"
        if r.get("processes", 1) > 1:
            label += f", {r['processes']} processes"
        f = r.get("figures") or {}
        if r["status"] != "ok" or not f:
            lines.append(f"| a | {label} | {r['status']} | | | | | | | {r['seconds']:.0f} | {_note(r)} |")
            continue
        memory = f"{f['memory_bytes'] / 2**30:.2f}{kind}"
        if f.get("predicted_peak_bytes"):
            memory += f" ({f['predicted_peak_bytes'] / 2**30:.2f})"
        mfu = _pct(f.get("mfu")) + (f" ({f['peak_source']})" if f.get("peak_source") not in (None, "table") else "")
        lines.append(
            f"| a | {label} | ok | {_num(f['images_per_s'], ',.0f')} | {mfu} | {_pct(f['data_wait_fraction'])} | "
            f"{_num(f['step_time_s'] and f['step_time_s'] * 1000, '.1f')} | {_num(f.get('floor_ratio'), '.2f')} | "
            f"{memory} | {r['seconds']:.0f} | {r.get('input', '')} |"
        )
    b = parts["b"]
    shards = items.get("shards", {})
    if b.get("figures"):
        fb = b["figures"]
        verdict = "pass" if fb["passed"] else "MISSED"
        lines.append(
            f"| b | data wait, plain Trainer compiled, {fb['rows']} rows of {fb['shard_size']} px shards, "
            f"{fb['workers']} worker(s) | ok | {_num(fb['images_per_s'], ',.0f')} | | "
            f"{_pct(fb['data_wait_fraction'])} | {_num(fb['step_time_s'] * 1000, '.1f')} | | | "
            f"{shards.get('seconds', 0):.0f} | target < {fb['target']:.0%}: {verdict} |"
        )
    else:
        why = _note(shards) if shards.get("status") != "ok" else "the compiled plain-Trainer run gave no figures"
        lines.append(f"| b | data wait on prepared shards | {b['status']} | | | | | | | "
                     f"{shards.get('seconds', 0):.0f} | {why} |")  # fmt: skip
    floor = items.get("floor", {})
    if floor.get("figures"):
        f = floor["figures"]
        predicted = f.get("predicted_peak_bytes")
        for variant in ("eager", "compiled"):
            v = f.get(variant, {"error": "not reached (the item stopped first)"})
            if "error" in v:
                lines.append(f"| c | floor {variant} | failed | | | | | | | | {v['error'].splitlines()[-1][:160]} |")
                continue
            memory = "" if v["peak_allocated_bytes"] is None else f"{v['peak_allocated_bytes'] / 2**30:.2f}"
            if memory and predicted:
                memory += f" ({predicted / 2**30:.2f})"
            mfu = _pct(v.get("mfu")) + (f" ({f['peak_source']})" if f.get("peak_source") != "table" else "")
            lines.append(
                f"| c | floor {variant}: plain loop, one batch on the device | ok | {_num(v['images_per_s'], ',.0f')} "
                f"| {mfu} | | {v['step_s'] * 1000:.1f} | 1.00 | {memory} | | {v['steps_per_s']:.1f} steps/s |"
            )
    else:
        lines.append(f"| c | floor | {floor.get('status', 'skipped')} | | | | | | | "
                     f"{floor.get('seconds', 0):.0f} | {_note(floor)} |")  # fmt: skip
    grid = items.get("planner-grid", {})
    if grid.get("status") == "ok":
        errors = [row["peak_error"] for row in grid["figures"]["rows"]]
        lines.append(
            f"| d | planner_memory_gpu.py, {len(errors)} configurations | ok | | | | | | | {grid['seconds']:.0f} | "
            f"planner peak error {min(errors):+.1%} to {max(errors):+.1%} |"
        )
    elif grid:
        lines.append(f"| d | planner_memory_gpu.py | {grid['status']} | | | | | | | {grid['seconds']:.0f} | "
                     f"{_note(grid)} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def pack_runs(out: Path, remove: bool) -> None:
    """OUT/runs/ as one OUT/runs.tar.gz; `remove`: delete the folders after (the GPU machine returns 8 files)."""
    runs = out / "runs"
    if not runs.is_dir():
        return
    with tarfile.open(out / "runs.tar.gz", "w:gz") as tar:
        tar.add(runs, arcname="runs")
    if remove:
        shutil.rmtree(runs)


# --------------------------------------------------------------------------- main


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", required=True, help="OUT: gpu_check.json, gpu_check.md, runs/ go here.")
    parser.add_argument(
        "--dry_run",
        action="store_true",
        help="The same items on the CPU: vit-tiny-cpu at 16 px, fp32, a few steps (CI's check).",
    )
    parser.add_argument(
        "--budget_s",
        type=float,
        default=None,
        help="Total seconds for every item (default 515 on the GPU; 420 dry, a cap: the dry run takes ~2 minutes).",
    )
    parser.add_argument(
        "--only",
        default=None,
        help="Comma-separated items to run (e.g. floor,ddp-compiled; names in gpu_check.json's "
        "items); the rest are skipped. For a rerun of what failed.",
    )
    parser.add_argument(
        "--wheels",
        default=str(REPO / ".whl"),
        help="Wheels installed when deepspeed, datasets or evaluate are missing (default .whl/).",
    )
    parser.add_argument("--site", default="/tmp/site", help="Where those wheels are installed (pip --target).")
    parser.add_argument(
        "--scratch_dir",
        default=None,
        help="Where the prepared shards go (3 GB on the GPU; default a temporary folder, removed at the end).",
    )
    parser.add_argument(
        "--keep_run_folders",
        action="store_true",
        help="Keep OUT/runs/ beside runs.tar.gz on the GPU too (the dry run always keeps it).",
    )
    parser.add_argument(
        "--floor_json",
        default=None,
        help="Internal: run only the floor, in this process, and write its figures to this file "
        "(the main run starts each item in its own process).",
    )
    parser.add_argument(
        "--source_dir",
        default=None,
        help="Internal: write only the repeated digits source (save_to_disk) to this folder.",
    )
    parser.add_argument("--source_copies", type=int, default=1, help="Internal: copies of the digits in --source_dir.")
    args = parser.parse_args(argv)
    if args.budget_s is not None and args.budget_s <= 0:
        parser.error("--budget_s must be positive")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    settings = DRY_RUN if args.dry_run else GPU
    if args.budget_s:
        settings = replace(settings, budget_s=args.budget_s)
    # This checkout's package for this process and its children; benchmarks/ (planner_memory_gpu, gpu_vit_b16) is
    # already first on sys.path when this file runs as a script.
    prepend_pythonpath(REPO)
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(1, str(BENCHMARKS))
    if args.floor_json:
        return floor_main(settings, args.floor_json)
    if args.source_dir:
        return source_main(args.source_dir, args.source_copies)
    if not settings.dry_run and not torch.cuda.is_available():
        print("error: no CUDA device. Fix: run this on the GPU machine, or add --dry_run (make gpu-check DRY_RUN=1).",
              file=sys.stderr)  # fmt: skip
        return 2
    out = Path(args.output_dir).resolve()
    if (out / "runs").exists():
        shutil.rmtree(out / "runs")  # a previous check's runs would mix with this one's
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("gpu_check.json", "gpu_check.md", "runs.tar.gz", "planner_memory_gpu.json"):
        (out / stale).unlink(missing_ok=True)
    set_child_env(settings)
    only = set(args.only.split(",")) if args.only else None
    check = Check(settings, out, only)
    scratch = Path(args.scratch_dir) if args.scratch_dir else Path(tempfile.mkdtemp(prefix="gpu-check-"))
    print(f"gpu_check: {'dry run on the CPU' if settings.dry_run else 'GPU'}, budget {settings.budget_s:.0f} s, "
          f"results in {out}", flush=True)  # fmt: skip
    try:
        check.run_setup(Path(args.wheels), Path(args.site))
        check.guarded("shards", "b", check.run_shards, scratch)
        ddp = ENGINES[0]
        check.guarded("ddp-eager", "a", check.run_engine, ddp, False)
        check.guarded("floor", "c", check.run_floor)
        check.guarded("ddp-compiled", "a", check.run_engine, ddp, True)
        for compiled in (False, True):
            for engine in ENGINES[1:]:
                name = f"{engine.name}-{'compiled' if compiled else 'eager'}"
                check.guarded(name, "a", check.run_engine, engine, compiled)
        check.guarded("planner-grid", "d", check.run_planner_grid)
    finally:
        if not args.scratch_dir:
            shutil.rmtree(scratch, ignore_errors=True)
        result = check.write()
        table = markdown(result)
        (out / "gpu_check.md").write_text(table)
        pack_runs(out, remove=not settings.dry_run and not args.keep_run_folders)
    print(table, flush=True)
    print(f"gpu_check: {out / 'gpu_check.json'}, exit code {result['exit_code']}", flush=True)
    return result["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
