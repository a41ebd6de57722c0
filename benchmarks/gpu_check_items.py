"""The GPU check's items (`Check`): each measurement as its own process, its record in OUT/gpu_check.json. Part of
benchmarks/gpu_check.py."""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
from gpu_check_processes import Clock, ensure_packages, log_tail, run_process
from gpu_check_settings import (
    BENCHMARKS,
    DATA_WAIT_TARGET,
    ENGINE,
    MAX_AUTOTUNE,
    PROFILED,
    REPO,
    Engine,
    Settings,
    item_kind,
    item_times,
    runs_here,
    shard_copies,
)
from torch.distributed.elastic.utils.distributed import get_free_port

# hf_vit_scaling.parallel.fast_paths.registry.ENV_SWITCH, written out: the package imports deepspeed, which
# `ensure_packages` installs only once the check runs (tests/launched/test_gpu_check.py checks both agree).
FAST_PATHS_SWITCH = "HF_VIT_SCALING_DEEPSPEED_FAST_PATHS"

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

    def run_item(self, name: str, scratch: Path) -> None:
        """One item of gpu_check_settings.item_order by its name, guarded."""
        if name == "shards":
            return self.guarded(name, "b", self.run_shards, scratch)
        if name == "floor":
            return self.guarded(name, "c", self.run_floor)
        if name == "planner-grid":
            return self.guarded(name, "d", self.run_planner_grid)
        if name == "profile":
            return self.guarded(name, "e", self.run_profile)
        kind, engine = item_kind(name)
        if name.endswith("-max-autotune"):
            return self.guarded(name, "a", self.run_engine, ENGINE[name.removesuffix("-max-autotune")], True,
                                MAX_AUTOTUNE)  # fmt: skip
        return self.guarded(name, "a", self.run_engine, ENGINE[engine], kind == "compiled")

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
        cmd = [
            sys.executable,
            BENCHMARKS / "gpu_check.py",
            *self.child_args(),
            "--source_dir",
            source,
            "--source_copies",
            copies,
        ]
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

    def run_engine(self, engine: Engine, compiled: bool, mode: str | None = None) -> None:
        """One recipe run; `mode`: its --torch_compile_mode (the max-autotune arm, named `<engine>-max-autotune`)."""
        s = self.settings
        name = f"{engine.name}-{'max-autotune' if mode else 'compiled' if compiled else 'eager'}"
        info = {"engine": engine.name, "label": engine.label, "compiled": compiled, "processes": engine.processes}
        if mode:
            info["compile_mode"] = mode
        if mode and not s.max_autotune:
            reason = "dry run: GPU only (inductor's GEMM autotuning benchmarks GPU kernels)"
            return self.not_applicable(name, "a", reason, **info)
        if compiled and not mode and engine.name not in s.compiled_engines:
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
        limit = self.begin(name, "a", *item_kind(name), **info)
        if limit is None:
            return
        start, out = time.monotonic(), self.runs / name
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        log = out / "gpu_check.log"
        steps, warmup = (s.compiled_steps, s.compiled_warmup) if compiled else (s.eager_steps, s.eager_warmup)
        ds_config = self.ds_config(engine, out)
        cmd = self.recipe_command(engine, ds_config, out, steps, warmup)
        if compiled:
            cmd += ["--torch_compile", "true", "--torch_compile_backend", s.compile_backend]
        if mode:
            cmd += ["--torch_compile_mode", mode]
        # an "auto" arm is the run before the project's changes, an "own" arm the resolved values alone: both with
        # DeepSpeed's own per-tensor loops
        status, _ = run_process(cmd, log, limit, env={FAST_PATHS_SWITCH: "0"} if engine.fast_paths_off else None)
        fields = {"input": self.input_name(), "steps": steps, "warmup_steps": warmup}
        if engine.auto:  # the numbers the run had instead of "auto" (the file itself is in the run's folder)
            written = json.loads(Path(ds_config).read_text())
            fields["auto_values"] = {"zero_optimization": written["zero_optimization"], "timers": written["timers"]}
        if status == "ok":
            try:
                fields["figures"] = figures = read_run(out)
                figures["predicted_peak_bytes"] = self.predicted(engine, ds_config)
                if figures["memory_kind"] == "allocated_peak_bytes" and figures["predicted_peak_bytes"]:
                    figures["memory_error"] = figures["predicted_peak_bytes"] / figures["memory_bytes"] - 1
            except Exception as err:  # a run that exits 0 without a readable report is a failed item
                status, fields["error"] = "failed", f"no readable throughput.json: {err!r}"
        else:
            fields["error"] = log_tail(log)
        drop_weights(out)
        self.finish(name, status, start, **fields)

    def ds_config(self, engine: Engine, out: Path) -> str | None:
        """The run's --ds_config: the ds_configs/ file, or for an "auto" arm a copy of it with transformers' fill
        written as numbers into the run's folder (benchmarks/engine_overhead.py's auto_config, from the preset's
        hidden size)."""
        if not engine.auto:
            return engine.ds_config and str(REPO / "ds_configs" / engine.ds_config)
        from engine_overhead import auto_config  # imported here: it imports the package, which needs deepspeed

        presets = self.planner[2] if self.planner else importlib.import_module("hf_vit_scaling.models.presets")
        hidden = presets.MODEL_PRESETS[self.settings.model_preset]["hidden_size"]
        return auto_config(engine.name, hidden, str(out))

    def recipe_command(self, engine: Engine, ds_config: str | None, out: Path, steps: int, warmup: int,
                       prefix: list | None = None) -> list[str]:  # fmt: skip
        """benchmarks/gpu_vit_b16.py's cell command for `engine` on the prepared shards; `prefix`: what runs the
        recipe file (default this Python; torchrun for a multi-process engine)."""
        from gpu_vit_b16 import cell_command

        s = self.settings
        cell = argparse.Namespace(
            model_preset=s.model_preset, image_size=s.image_size, batch_size=s.batch_size, workers=s.workers,
            steps=steps, bf16=s.precision == "bf16", cpu_smoke=s.dry_run, warmup=warmup,
        )  # fmt: skip
        launcher = prefix
        if engine.processes > 1:
            from hf_vit_scaling.parallel.launch import launch_command  # this checkout's (on PYTHONPATH by now)

            launcher = launch_command("torchrun", engine.processes, get_free_port()) + (prefix or [])[1:]
        cmd = cell_command(cell, ds_config, "device", str(out), launcher)
        # Full batches only: a short last batch has another shape, which a compiled model recompiles for.
        cmd += [*engine.flags, "--dataloader_drop_last", "true"]
        if self.shards:
            cmd += ["--dataset_name", str(self.shards)]
        return cmd

    def input_name(self) -> str:
        return "shards" if self.shards else "digits (the shards were not prepared)"

    def predicted(self, engine: Engine, ds_config: str | None = None) -> int | None:
        if self.planner is None:
            return None
        from planner_memory_gpu import predict

        ds_configs = self.planner[0].read_ds_configs(str(REPO / "ds_configs"))
        if engine.auto and ds_config:  # the planner sizes the buckets from the file the run had
            ds_configs[engine.planner_engine] = json.loads(Path(ds_config).read_text())
        s = self.settings
        return predict(self.planner, s.model_preset, s.image_size, s.batch_size, s.precision,
                       engine=engine.planner_engine, world_size=engine.processes,
                       ds_configs=ds_configs)["peak"]  # fmt: skip

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
        status, _ = run_process(
            [sys.executable, BENCHMARKS / "gpu_check.py", *self.child_args(), "--floor_json", result], log, limit
        )
        figures = json.loads(result.read_text()) if result.is_file() else None
        errors = [
            f"{v}: {figures[v]['error']}" for v in ("eager", "compiled") if "error" in (figures or {}).get(v, {})
        ]
        if status == "ok":
            self.finish(name, status, start, figures=figures)
        else:  # one variant may have its figures (the other failed)
            self.finish(name, status, start, figures=figures, error="\n".join(errors) or log_tail(log))

    # ----- e: the profile

    def run_profile(self) -> None:
        """torch.profiler over `profile_steps` steps of the floor, the plain Trainer and ZeRO-2, each its own
        process (benchmarks/gpu_check_profile.py); a summary per run, written as each one ends."""
        s, name = self.settings, "profile"
        limit = self.begin(name, "e", "profile", runs=list(PROFILED), steps=s.profile_steps)
        if limit is None:
            return
        start, out = time.monotonic(), self.runs / name
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        log, worker = out / "gpu_check.log", [sys.executable, BENCHMARKS / "gpu_check_profile.py"]
        figures, errors, statuses = {}, {}, []
        for run in PROFILED:
            summary = out / f"{run}.json"
            if run == "floor":
                cmd = [*worker, "--out", summary, *(["--dry_run"] if s.dry_run else []), "floor"]
            else:
                prefix = [*worker, "--out", summary, "--start", s.profile_warmup, "--steps", s.profile_steps, "--"]
                engine, steps = ENGINE[run], s.profile_warmup + s.profile_steps + 1  # one step after the window
                ds_config = self.ds_config(engine, out)
                cmd = self.recipe_command(engine, ds_config, out / run, steps, 1, [str(c) for c in prefix])
            left = limit - (time.monotonic() - start)
            status, _ = run_process(cmd, log, left) if left >= 1 else ("timeout", None)
            statuses.append(status)
            if status == "ok" and summary.is_file():
                figures[run] = json.loads(summary.read_text())
            else:
                errors[run] = f"{status}: {log_tail(log, lines=10)}"
            if run != "floor":
                drop_weights(out / run)
            self.items[name]["figures"] = figures
            self.write()
        status = next((st for st in ("timeout", "failed") if st in statuses), "ok")
        fields = {"figures": figures, "input": self.input_name()}
        if errors:
            fields["error"] = "\n".join(f"{run}: {text}" for run, text in errors.items())
        self.finish(name, status, start, **fields)

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
        for part in ("a", "b", "c", "d", "e"):
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


def read_run(out: Path) -> dict:
    """A finished recipe run's figures (benchmarks/gpu_vit_b16.py's read_cell) and the DeepSpeed values the
    project resolved for it, with their reasons, and DeepSpeed's fast paths, installed and run in the measured steps
    (throughput.json's setup.deepspeed_resolved, deepspeed_fast_paths and deepspeed_fast_paths_ran)."""
    from gpu_vit_b16 import read_cell

    from hf_vit_scaling.throughput.schema import load_throughput_report

    figures = read_cell(str(out))
    setup = load_throughput_report(str(out / "throughput.json"))["setup"]
    figures["deepspeed_resolved"] = setup.get("deepspeed_resolved", {})
    figures["deepspeed_fast_paths"] = setup.get("deepspeed_fast_paths", {})
    figures["deepspeed_fast_paths_ran"] = setup.get("deepspeed_fast_paths_ran", {})
    return figures


def drop_weights(folder: Path) -> None:
    """A run's saved model (ViT-B/16: 86 M x 4 bytes = 344 MB) is not a measurement: delete it, keep the reports and
    logs."""
    for pattern in ("*.safetensors", "pytorch_model*.bin", "*.pt"):
        for path in folder.rglob(pattern):
            path.unlink()
