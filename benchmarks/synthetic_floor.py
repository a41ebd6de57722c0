#!/usr/bin/env python
"""The recipe's steady-state step time against a synthetic-data floor, on this machine's CPU; with `--compile`, each
engine's floor and recipe eager against compiled (torch.compile).

    python benchmarks/synthetic_floor.py --rounds 3 --output benchmarks/results/synthetic_floor.json
    python benchmarks/synthetic_floor.py --compile --rounds 3 --output benchmarks/results/compile_speed.json

The floor runs the same model, engine and precision on one batch already on the device: no loader, no callbacks,
no Trainer; the optimizer step included.
  - plain Trainer: `gpu_check_floor.plain_step`, the Trainer's step without DeepSpeed (forward, backward, clipping at
    1.0, fused AdamW, zero_grad);
  - ZeRO-0/2/3: the same model and fused AdamW in a DeepSpeed engine built from the same ds_configs/ file, its
    "auto" values filled by transformers' own `HfTrainerDeepSpeedConfig` (as the Trainer fills them), then
    engine(batch), engine.backward(loss), engine.step().
The recipe arm is `recipes/train_vit.py` with that engine on the built-in digits (the device input path, the
throughput report on). Both arms time the same thing: the median time between consecutive step ends, the first
`--warmup` steps dropped (for the recipe: `step_time_s.median` of its throughput.json). Every arm runs in its own
fresh process; per round each engine runs floor then recipe, and the engines take turns; the ratio reported is the
median over rounds of floor step / recipe step (1.0 = the recipe is as fast as its engine allows).

`--compile`: per round and engine, each arm runs eager and compiled (`--backend`, inductor by default: what
`--torch_compile` gives), each in its own fresh process with a fresh (cold) inductor cache, in ABBA order over the
rounds (round 1 eager then compiled, round 2 compiled then eager, ...), so a drift of the machine over the run
falls on both alike. The floor compiles as `gpu_check_floor.plain_step(compile_model=True)` does (plain) or by
`DeepSpeedEngine.compile()` (ZeRO), the recipe through `--torch_compile`. Compiling happens in the warm-up steps,
which the steady-state step time leaves out; the warm-up's wall seconds, dynamo's compile seconds and its graphs
are recorded apart (the recipe's from its throughput.json `compile` section, the floor's from the same dynamo
counters, read before, between and after the warm-up and timed steps), and whether every compile fell inside the
warm-up. The speedup per round is eager step / compiled step (the compiled step rate over the eager one; above 1
compiled is faster); reported: its median over rounds and its min-max. FSDP2 runs the recipe arm only, in 2
processes (torchrun, 1 thread and half the batch each: FSDP2 on a CPU world needs at least 2 ranks,
`parallel/engine.select_fsdp_on_cpu`); the floor, one process by construction, has no FSDP2 arm.
The `--compile` run at the top (3 rounds of plain, ZeRO-2, ZeRO-3 and FSDP2: 42 processes, 21 of them compiling
cold) needs a quiet machine (its wall time: benchmarks/README.md, "The recipe against a synthetic-data floor").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from _common import child_env, report_result  # benchmarks/_common.py (scripts run as benchmarks/<name>.py)
from torch.distributed.elastic.utils.distributed import get_free_port

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the checkout's package, also when another copy is installed

from hf_vit_scaling.parallel.launch import launch_command  # noqa: E402
from hf_vit_scaling.throughput.compilation import dynamo_totals  # noqa: E402
from hf_vit_scaling.throughput.schema import load_throughput_report  # noqa: E402

DS_CONFIGS = {"plain": None, "zero0": "zero0.json", "zero2": "zero2.json", "zero3": "zero3.json"}  # floor and recipe
RECIPE_ONLY = {"fsdp2": 2}  # engine: the recipe's processes (no floor arm: see the module docstring)
ENGINES = [*DS_CONFIGS, *RECIPE_ONLY]
COMPILE_ENGINES = ["plain", "zero2", "zero3", "fsdp2"]  # --compile's default
ABBA = (("eager", "compiled"), ("compiled", "eager"))  # the order of round 1, 3, ... and of round 2, 4, ...
DIGITS_LABELS = [str(digit) for digit in range(10)]
LR = 1e-3


def deepspeed_step(model: torch.nn.Module, ds_config: Path, batch_size: int, steps: int, scratch: str,
                   compile_backend: str | None = None):  # fmt: skip
    """The DeepSpeed engine the Trainer builds for `ds_config`, stepped by hand. transformers fills the config's
    "auto" values from TrainingArguments and the model (`trainer_config_finalize`), as in the recipe. With
    `compile_backend`: compiled by `DeepSpeedEngine.compile()`, as accelerate compiles it under `--torch_compile`."""
    import deepspeed
    from transformers import TrainingArguments

    from hf_vit_scaling.training.compile import compile_in_place

    args = TrainingArguments(
        output_dir=scratch,
        per_device_train_batch_size=batch_size,
        learning_rate=LR,
        max_grad_norm=1.0,
        deepspeed=str(ds_config),
        report_to="none",
    )
    hf_config = args.hf_deepspeed_config
    hf_config.trainer_config_finalize(args, model, steps)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, fused=True)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=hf_config.config)
    if compile_backend:
        compile_in_place(engine, compile_backend, None)

    def step(pixels: torch.Tensor, labels: torch.Tensor) -> None:
        loss = engine(pixel_values=pixels, labels=labels).loss
        engine.backward(loss)
        engine.step()

    return step


def time_with_compile_figures(step, batch: tuple[torch.Tensor, torch.Tensor], steps: int, warmup: int) -> dict:
    """`gpu_check_floor.time_steps`'s figures of `steps` timed steps after `warmup` untimed ones, with what dynamo
    compiled: graphs (in all steps, and after the warm-up: recompilations), compile seconds, the warm-up's wall
    seconds. Its counters are read before, between and after the two phases only, so no step pays for reading them."""
    from gpu_check_floor import time_steps

    before = dynamo_totals()
    start = time.perf_counter()
    for _ in range(warmup):
        step(*batch)
    warmup_s = time.perf_counter() - start
    after_warmup = dynamo_totals()
    result = time_steps(step, batch, steps, warmup=0)
    end = dynamo_totals()
    graphs = end[0] - before[0]
    return {
        **result,
        "warmup_steps": warmup,
        "warmup_s": warmup_s,
        "graphs": graphs,
        "graphs_after_warmup": end[0] - after_warmup[0],
        "compile_s": max(0.0, end[1] - before[1]),
    }


def floor_worker(args) -> None:
    """The floor arm's own process: prints one JSON line with `time_with_compile_figures`'s figures."""
    from gpu_check_floor import plain_step

    from hf_vit_scaling.models.presets import build_model_from_preset, preset_config

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = preset_config(args.model_preset, DIGITS_LABELS, image_size=args.image_size)
    model = build_model_from_preset(config)
    batch = (
        torch.randn(args.batch_size, 3, args.image_size, args.image_size),
        torch.randint(0, len(DIGITS_LABELS), (args.batch_size,)),
    )
    with tempfile.TemporaryDirectory() as scratch:
        if DS_CONFIGS[args.floor_worker] is None:
            step = plain_step(model, "fp32", compile_model=args.compiled, lr=LR, backend=args.backend)
        else:
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port), RANK="0", LOCAL_RANK="0")
            os.environ.update(WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
            ds_config = REPO / "ds_configs" / DS_CONFIGS[args.floor_worker]
            backend = args.backend if args.compiled else None
            step = deepspeed_step(model, ds_config, args.batch_size, args.steps + args.warmup, scratch, backend)
        result = time_with_compile_figures(step, batch, args.steps, args.warmup)
    print("RESULT", json.dumps(result), flush=True)


def arm_env(threads: int, compiled: bool, scratch: str) -> dict:
    """A fresh process's environment; a compiled one gets its own empty inductor cache (cold: every compiled run
    pays the whole compile, as a first run does)."""
    env = child_env(threads)
    if compiled:
        env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(scratch, "inductor_cache")
    return env


def floor(args, engine: str, compiled: bool = False) -> dict:
    """The floor arm in a fresh process: step_s (median), warmup_s, graphs_per_rank, graphs_after_warmup,
    compile_s, compiled_within_warmup (null: nothing compiled)."""
    cmd = [sys.executable, __file__, "--floor_worker", engine, "--port", str(get_free_port()), *shared_flags(args)]
    cmd += ["--backend", args.backend] + (["--compiled"] if compiled else [])
    with tempfile.TemporaryDirectory() as scratch:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=arm_env(args.threads, compiled, scratch))
    if proc.returncode != 0:
        raise RuntimeError(f"floor {engine} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.split("RESULT", 1)[1])
    return {
        "step_s": result["step_s_median"],
        "warmup_s": result["warmup_s"],
        "graphs_per_rank": [result["graphs"]],
        "graphs_after_warmup": result["graphs_after_warmup"],
        "compile_s": result["compile_s"],
        "compiled_within_warmup": result["graphs_after_warmup"] == 0 if result["graphs"] else None,
    }


def engine_flags(engine: str) -> list[str]:
    if engine == "fsdp2":
        return ["--fsdp", "--fsdp_config", str(REPO / "fsdp_configs" / "fsdp2.json")]
    return ["--ds_config", str(REPO / "ds_configs" / DS_CONFIGS[engine])] if DS_CONFIGS[engine] else []


def recipe(args, engine: str, compiled: bool = False) -> dict:
    """The recipe arm in fresh process(es) (`RECIPE_ONLY`'s count, one thread and an equal share of the batch
    each): the same keys as `floor`, from its throughput.json (step_time_s.median and the compile section)."""
    nproc = RECIPE_ONLY.get(engine, 1)
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            *launch_command("torchrun" if nproc > 1 else "python", nproc, get_free_port()),
            str(REPO / "recipes" / "train_vit.py"), "--output_dir", out,
            "--model_preset", args.model_preset, "--image_size", str(args.image_size),
            "--per_device_train_batch_size", str(args.batch_size // nproc),
            "--max_steps", str(args.steps + args.warmup),
            "--throughput_warmup_steps", str(args.warmup), "--learning_rate", str(LR),
            "--crop_scale_min", "0.5", "--horizontal_flip", "false", "--input_path", "device",
            "--eval_strategy", "no", "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true",
            "--logging_steps", str(args.steps + args.warmup), "--seed", "0", "--dataloader_num_workers", "0",
            *engine_flags(engine),
        ]  # fmt: skip
        if compiled:
            cmd += ["--torch_compile", "true", "--torch_compile_backend", args.backend]
        env = arm_env(max(1, args.threads // nproc), compiled, out)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"recipe {engine} failed:\n{proc.stderr[-3000:]}")
        report = load_throughput_report(os.path.join(out, "throughput.json"))
    facts = report["compile"]
    return {
        "step_s": report["step_time_s"]["median"],
        "warmup_s": facts["warmup_time_s"],
        "graphs_per_rank": facts["graphs_per_rank"],
        "graphs_after_warmup": facts["recompiles_after_warmup"],
        "compile_s": facts["compile_time_s"],
        "compiled_within_warmup": facts["compiled_within_warmup"],
    }


def arms(engine: str) -> dict:
    """{arm: its runner} of `engine`: floor and recipe, the recipe alone where the floor has no such engine."""
    return {"recipe": recipe} if engine in RECIPE_ONLY else {"floor": floor, "recipe": recipe}


def eager_and_compiled(args, engine: str, arm: str, order: tuple[str, str]) -> dict:
    """One round of one arm: eager and compiled in `order`, and the speedup (eager step / compiled step). Refuses
    a compiled run in which dynamo compiled nothing: its figures would be eager ones under the compiled label."""
    runs = {variant: arms(engine)[arm](args, engine, variant == "compiled") for variant in order}
    if not all(runs["compiled"]["graphs_per_rank"]):
        raise RuntimeError(f"{arm} {engine}: the compiled run compiled no graph on some rank: {runs['compiled']}")
    return {"eager": runs["eager"], "compiled": runs["compiled"],
            "speedup": runs["eager"]["step_s"] / runs["compiled"]["step_s"]}  # fmt: skip


def compile_summary(rounds: list[dict], engines: list[str]) -> dict:
    """{engine: {arm: figures over rounds}}: median step times, warm-up and compile seconds; the speedup's median
    and min-max over rounds; graphs per rank (the first round's), the most recompilations after warm-up, and
    whether every round compiled inside its warm-up."""

    def median(engine, arm, variant, key):
        return statistics.median(r[engine][arm][variant][key] for r in rounds)

    summary = {}
    for engine in engines:
        summary[engine] = {}
        for arm in arms(engine):
            speedups = [r[engine][arm]["speedup"] for r in rounds]
            compiled = [r[engine][arm]["compiled"] for r in rounds]
            summary[engine][arm] = {
                "eager_step_s": median(engine, arm, "eager", "step_s"),
                "compiled_step_s": median(engine, arm, "compiled", "step_s"),
                "speedup": statistics.median(speedups),
                "speedup_min": min(speedups),
                "speedup_max": max(speedups),
                "eager_warmup_s": median(engine, arm, "eager", "warmup_s"),
                "compiled_warmup_s": median(engine, arm, "compiled", "warmup_s"),
                "compile_s": median(engine, arm, "compiled", "compile_s"),
                "graphs_per_rank": compiled[0]["graphs_per_rank"],
                "recompiles_after_warmup": max(c["graphs_after_warmup"] for c in compiled),
                "compiled_within_warmup": all(c["compiled_within_warmup"] for c in compiled),
            }
    return summary


def compare_compiled(args) -> dict:
    """Every engine's arms eager and compiled, `args.rounds` rounds in ABBA order (see the module docstring)."""
    rounds = []
    for index in range(args.rounds):
        order = ABBA[index % 2]
        record = {"order": list(order)}
        for engine in args.engines:
            record[engine] = {arm: eager_and_compiled(args, engine, arm, order) for arm in arms(engine)}
            speedups = {arm: round(r["speedup"], 3) for arm, r in record[engine].items()}
            print(f"round {index + 1} {engine}: speedup {json.dumps(speedups)}", file=sys.stderr, flush=True)
        rounds.append(record)
    return {"median_over_rounds": compile_summary(rounds, args.engines), "rounds": rounds}


def compare_floor_and_recipe(args) -> dict:
    """Every engine's floor against its recipe, eager, `args.rounds` rounds (see the module docstring)."""
    rounds = []
    for _ in range(args.rounds):
        record = {}
        for engine in args.engines:
            floor_s, recipe_s = floor(args, engine)["step_s"], recipe(args, engine)["step_s"]
            record[engine] = {"floor_step_s": floor_s, "recipe_step_s": recipe_s, "ratio": floor_s / recipe_s}
            print(f"round {len(rounds) + 1} {engine}: {json.dumps(record[engine])}", file=sys.stderr, flush=True)
        rounds.append(record)
    summary = {
        engine: {
            key: statistics.median(r[engine][key] for r in rounds)
            for key in ("floor_step_s", "recipe_step_s", "ratio")
        }
        for engine in args.engines
    }
    return {"median_over_rounds": summary, "rounds": rounds}


def shared_flags(args) -> list[str]:
    return [
        "--model_preset", args.model_preset, "--image_size", str(args.image_size),
        "--batch_size", str(args.batch_size), "--steps", str(args.steps), "--warmup", str(args.warmup),
        "--threads", str(args.threads),
    ]  # fmt: skip


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_preset", default="vit-tiny-cpu", help="Preset of both arms.")
    parser.add_argument("--image_size", type=int, default=32, help="Input resolution (32 px: 65 tokens).")
    parser.add_argument("--batch_size", type=int, default=128, help="Batch per step of both arms (all ranks).")
    parser.add_argument("--steps", type=int, default=50, help="Timed optimizer steps per arm.")
    parser.add_argument("--warmup", type=int, default=10, help="Steps before the timed ones, dropped.")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (OMP_NUM_THREADS) in every arm.")
    parser.add_argument("--rounds", type=int, default=3, help="Rounds; every engine's arms run once per round.")
    parser.add_argument("--engines", nargs="+", default=None, choices=ENGINES,
                        help=f"Engines to run (default: {', '.join(DS_CONFIGS)}; with --compile: "
                        f"{', '.join(COMPILE_ENGINES)}).")  # fmt: skip
    parser.add_argument("--compile", action="store_true", help="Each arm eager against compiled (docstring).")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend of the compiled runs.")
    parser.add_argument("--output", default=None, help="Write the result as JSON here.")
    parser.add_argument("--floor_worker", default=None, choices=list(DS_CONFIGS), help=argparse.SUPPRESS)
    parser.add_argument("--compiled", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=29533, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.engines is None:
        args.engines = COMPILE_ENGINES if args.compile else list(DS_CONFIGS)
    recipe_only = [engine for engine in args.engines if engine in RECIPE_ONLY]
    if recipe_only and not args.compile:
        parser.error(f"--engines {' '.join(recipe_only)} has no floor arm to compare its recipe with. "
                     "Fix: add --compile, or leave it out.")  # fmt: skip
    uneven = [e for e in recipe_only if args.batch_size % RECIPE_ONLY[e] or args.threads % RECIPE_ONLY[e]]
    if uneven:
        processes = ", ".join(f"{engine}: {RECIPE_ONLY[engine]}" for engine in uneven)
        parser.error(f"--batch_size {args.batch_size} and --threads {args.threads} do not split evenly over the "
                     f"processes ({processes}). Fix: give multiples of them.")  # fmt: skip
    return args


def setup(args) -> dict:
    import deepspeed
    import transformers

    described = {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "threads": args.threads,
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "deepspeed": deepspeed.__version__,
        },  # fmt: skip
        "model_preset": args.model_preset,
        "image_size": args.image_size,
        "batch_size": args.batch_size,
        "precision": "fp32",
        "processes": 1,
        "timed_steps": args.steps,
        "warmup_dropped": args.warmup,
        "rounds": args.rounds,
    }
    if args.compile:
        described.update(
            backend=args.backend,
            processes={engine: RECIPE_ONLY.get(engine, 1) for engine in args.engines},
            order="ABBA over rounds: odd rounds eager then compiled, even rounds compiled then eager",
            inductor_cache="cold: a fresh folder per compiled process",
        )
    return described


def main(argv=None) -> None:
    args = parse(argv)
    if args.floor_worker:
        floor_worker(args)
        return
    start = time.time()
    measured = compare_compiled(args) if args.compile else compare_floor_and_recipe(args)
    result = {"setup": setup(args), **measured, "wall_s": round(time.time() - start, 1)}
    report_result(result, args.output)


if __name__ == "__main__":
    main()
