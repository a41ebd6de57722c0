#!/usr/bin/env python
"""Every engine's per-step overhead over the plain Trainer, timed and counted, on this machine's CPU.

    python benchmarks/engine_overhead.py --rounds 3 --output benchmarks/results/engine_overhead.json

Timed: `recipes/train_vit.py` on the built-in digits with the tiny preset (16 px, a global batch of 32: 32 on one
process, 16 on each of two), `--steps` steps after `--warmup` dropped; the figure is the throughput report's median
step time (`step_time_s.median`). Arms: the plain Trainer (DDP on two processes), ZeRO-0/1/2/3, ZeRO-2/3 with
offload, FSDP2 (two processes), with the resolved DeepSpeed values (`ds_configs/` as shipped); ZeRO-2/3 "auto" as
transformers alone fills them, with DeepSpeed's own per-tensor loops (the behaviour before the resolution:
`auto_config`); ZeRO-1/2/3 "own": the resolved values, DeepSpeed's own loops (what the fast paths add). Each arm in
its own fresh process(es). Per round the arms of one world size start together and take turns, `--turn_steps`
optimizer steps at a time (`Turns`: the waiting arms block on a FIFO, outside every timed step), the order reversed
every other round (`--turn_steps 0`: one after another); reported: the median over rounds of each arm's step time
and of its ratio to the same round's plain Trainer.

Counted (one more run per arm, `--count_steps` steps after the warm-up, `Counters` installed in every process
before the recipe starts), per step and rank: DeepSpeed's gradient-bucket flushes, `torch.distributed` collectives
by name, device synchronizations (free on this CPU, so counted rather than timed), host reads of tensors and forward
hooks run. With `--vit_b16`, the same counts for ZeRO-2 and ZeRO-3 (auto and resolved) on ViT-B/16's real
parameter list (224 px, batch 1, one process).
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import child_env, report_result  # benchmarks/_common.py (scripts run as benchmarks/<name>.py)
from torch.distributed.elastic.utils.distributed import get_free_port

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the checkout's package, also when another copy is installed

from hf_vit_scaling.parallel.fast_paths.registry import ENV_SWITCH as FAST_PATHS_SWITCH  # noqa: E402
from hf_vit_scaling.parallel.launch import launch_command  # noqa: E402
from hf_vit_scaling.throughput.schema import load_throughput_report  # noqa: E402

CONFIGS = {"plain": None, "zero0": "zero0.json", "zero1": "zero1.json", "zero2": "zero2.json", "zero3": "zero3.json",
           "zero2_offload": "zero2_offload.json", "zero3_offload": "zero3_offload.json", "fsdp2": None,
           "zero2_auto": "zero2.json", "zero3_auto": "zero3.json", "zero1_own": "zero1.json",
           "zero2_own": "zero2.json", "zero3_own": "zero3.json"}  # fmt: skip
TWO_PROCESSES_ONLY = {"fsdp2"}  # FSDP2 on a CPU world needs 2 ranks (parallel/engine.select_fsdp_on_cpu)
DIGITS = [str(d) for d in range(10)]


# --------------------------------------------------------------------------- "auto" as transformers fills it


def auto_config(name: str, hidden: int, folder: str) -> str:
    """`name`'s ds_configs/ file with transformers' own fill of the model-sized keys written as numbers
    (`HfTrainerDeepSpeedConfig.trainer_config_finalize`: reduce_bucket_size hidden^2; ZeRO-3 prefetch 0.9 hidden^2,
    persistence 10 hidden), DeepSpeed's defaults elsewhere (allgather 5e8, timer on), no leaf module, and
    overlap_comm and contiguous_gradients on: the run as it was before the project resolved them. Numbers in the
    file win over the resolution."""
    with open(REPO / "ds_configs" / CONFIGS[name], encoding="utf-8") as f:
        config = json.load(f)
    zero = config.setdefault("zero_optimization", {})
    zero["reduce_bucket_size"] = hidden * hidden
    if zero.get("stage") in (2, 3):
        zero.update(overlap_comm=True, contiguous_gradients=True)  # as ds_configs/ shipped them
    if zero.get("stage") in (1, 2):
        zero["allgather_bucket_size"] = 500_000_000
    if zero.get("stage") == 3:
        zero.update(stage3_prefetch_bucket_size=int(0.9 * hidden * hidden),
                    stage3_param_persistence_threshold=10 * hidden, leaf_module={"classes": []})  # fmt: skip
    config["timers"] = {"throughput": {"enabled": True, "synchronized": True}}
    path = os.path.join(folder, f"{name}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f)
    return path


def engine_flags(name: str, hidden: int, folder: str) -> list[str]:
    if name == "fsdp2":
        return ["--fsdp", "--fsdp_config", str(REPO / "fsdp_configs" / "fsdp2_sharded.json")]
    if CONFIGS[name] is None:
        return ["--ddp_find_unused_parameters", "false"]
    path = auto_config(name, hidden, folder) if name.endswith("_auto") else str(REPO / "ds_configs" / CONFIGS[name])
    return ["--ds_config", path]


# --------------------------------------------------------------------------- one run


def recipe_argv(args, nproc: int, out: str, steps: int, model: tuple[str, int, int]) -> list[str]:
    preset, image_size, batch = model
    return [str(REPO / "recipes" / "train_vit.py"), "--output_dir", out, "--model_preset", preset,
            "--image_size", str(image_size), "--per_device_train_batch_size", str(batch // nproc),
            "--max_steps", str(steps + args.warmup), "--throughput_warmup_steps", str(args.warmup),
            "--learning_rate", "1e-3", "--crop_scale_min", "0.5", "--horizontal_flip", "false",
            "--eval_strategy", "no", "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true",
            "--logging_steps", "10", "--seed", "0", "--dataloader_num_workers", "0"]  # fmt: skip


def run_arm(args, name: str, nproc: int, count: bool = False, model=None) -> dict:
    """One run of arm `name` on `nproc` processes: its throughput report's median step time, and with `count` the
    per-step counts of every rank (`Counters`)."""
    with tempfile.TemporaryDirectory() as out:
        steps = args.count_steps if count else args.steps
        probe = ["--probe", out, "--probe_warmup", str(args.warmup)] if count else []
        cmd = arm_command(args, name, nproc, out, steps, probe, model)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=arm_env(args, name, nproc))
        if proc.returncode != 0:
            raise RuntimeError(f"{name} on {nproc} process(es) failed:\n{proc.stderr[-3000:]}")
        report = load_throughput_report(os.path.join(out, "throughput.json"))
        result = {
            "step_s": report["step_time_s"]["median"],
            "resolved": report["setup"]["deepspeed_resolved"],
            "fast_paths": report["setup"]["deepspeed_fast_paths"],
        }
        if count:
            result["counts_per_step"] = [json.load(open(os.path.join(out, f"counts_rank{r}.json"))) for r in
                                         range(nproc)]  # fmt: skip
    return result


def arm_command(args, name: str, nproc: int, out: str, steps: int, through: list[str], model=None) -> list[str]:
    """The launch command of arm `name`: the recipe under its launcher, run through this script (`--probe`,
    `--turns`) when `through` names how."""
    model = model or (args.model_preset, args.image_size, args.batch_size)
    hidden = 768 if model[0] == "vit-b-16" else args.hidden
    launcher = launch_command("torchrun" if nproc > 1 else "python", nproc, get_free_port())
    wrapper = [__file__, *through, "--"] if through else []
    return [*launcher, *wrapper, *recipe_argv(args, nproc, out, steps, model), *engine_flags(name, hidden, out)]


def run_together(args, names: list[str], nproc: int) -> dict[str, float]:
    """One round of the arms `names` on `nproc` processes each, started together and taking turns `--turn_steps`
    steps at a time in this order (`Turns`): {name: median step seconds}."""
    with tempfile.TemporaryDirectory() as folder:
        Turns.prepare(folder, len(names), nproc)
        running = []
        try:
            start_arms(args, names, nproc, folder, running)
            while True:
                codes = {name: proc.poll() for name, _, proc in running}
                failed = [name for name, code in codes.items() if code not in (None, 0)]
                if failed:  # stop at once: the others would wait for its turn for ever
                    raise RuntimeError(f"{failed[0]} on {nproc} process(es) failed:\n" + tail_of(folder, failed[0]))
                if None not in codes.values():
                    break
                time.sleep(0.5)
        finally:
            for _, log, proc in running:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                log.close()
        return {
            name: load_throughput_report(os.path.join(folder, name, "throughput.json"))["step_time_s"]["median"]
            for name in names
        }


def start_arms(args, names: list[str], nproc: int, folder: str, running: list) -> None:
    """Start every arm's processes (they wait for their turn, `Turns`), each appended to `running` as it starts so
    the caller can stop all of them if one fails."""
    for arm, name in enumerate(names):
        out = os.path.join(folder, name)
        os.makedirs(out)  # before engine_flags writes an "auto" arm's config there
        turns = ["--turns", folder, "--arm", str(arm), "--arms", str(len(names)), "--turn_steps", str(args.turn_steps)]
        cmd = arm_command(args, name, nproc, out, args.steps, turns)
        log = open(os.path.join(folder, f"{name}.log"), "w", encoding="utf-8")
        env = arm_env(args, name, nproc)  # its own session: a stop reaches torchrun's ranks too (os.killpg)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        running.append((name, log, proc))


def tail_of(folder: str, name: str) -> str:
    with open(os.path.join(folder, f"{name}.log"), encoding="utf-8", errors="replace") as f:
        return f.read()[-3000:]


def arm_env(args, name: str, nproc: int) -> dict:
    env = child_env(max(1, args.threads // nproc))
    if name.endswith(("_auto", "_own")):  # the behaviour before, and the resolved values alone: DeepSpeed's code
        env[FAST_PATHS_SWITCH] = "0"
    return env


# --------------------------------------------------------------------------- the counters (--probe)


class Counters:
    """Per-step counts in one process, after the warm-up: installed by patching before the recipe imports run."""

    def __init__(self, warmup: int, out: str):
        self.warmup, self.out, self.on, self.steps = warmup, out, False, 0
        self.counts: dict[str, int] = {}

    def add(self, key: str, n: int = 1) -> None:
        if self.on:
            self.counts[key] = self.counts.get(key, 0) + n

    def wrap(self, owner, name: str, key: str) -> None:
        original = getattr(owner, name)

        def counted(*a, **k):
            self.add(key)
            return original(*a, **k)

        setattr(owner, name, counted)

    def install(self) -> None:
        import deepspeed.runtime.zero.stage3 as stage3
        import deepspeed.runtime.zero.stage_1_and_2 as stage12
        import torch
        import torch.distributed as dist
        from deepspeed.accelerator import get_accelerator

        self.wrap(stage12.DeepSpeedZeroOptimizer, "reduce_ipg_grads", "bucket_flushes")
        stage3_flush = "_DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads"  # name-mangled private
        self.wrap(stage3.DeepSpeedZeroOptimizer_Stage3, stage3_flush, "bucket_flushes")
        for name in (
            "all_reduce",
            "all_gather",
            "all_gather_into_tensor",
            "reduce_scatter_tensor",
            "broadcast",
            "reduce_scatter",
            "all_to_all_single",
            "barrier",
            "_all_gather_base",
            "_reduce_scatter_base",
        ):
            if hasattr(dist, name):
                self.wrap(dist, name, f"collective.{name}")
        self.wrap(torch.cuda, "synchronize", "device_syncs")
        self.wrap(type(get_accelerator()), "synchronize", "device_syncs")
        for name in ("item", "tolist", "cpu"):
            self.wrap(torch.Tensor, name, "host_reads")
        counters = self

        def count_hooks(module, inputs):
            counters.add("forward_hooks_run", len(module._forward_pre_hooks) + len(module._forward_hooks))

        torch.nn.modules.module.register_module_forward_pre_hook(count_hooks)
        add_callback_to_every_trainer(CountingWindow(counters))

    def write(self, rank: int) -> None:
        per_step = {key: value / max(self.steps, 1) for key, value in sorted(self.counts.items())}
        with open(os.path.join(self.out, f"counts_rank{rank}.json"), "w", encoding="utf-8") as f:
            json.dump({"steps": self.steps, **per_step}, f)


def CountingWindow(counters: Counters):  # noqa: N802 (a TrainerCallback made where transformers is imported)
    from transformers import TrainerCallback

    from hf_vit_scaling.parallel.fast_paths.weight_gathers import leave_weights_alone

    class Window(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            counters.on = state.global_step >= counters.warmup

        def on_step_end(self, args, state, control, **kwargs):
            counters.steps += counters.on

        def on_train_end(self, args, state, control, **kwargs):
            counters.on = False
            counters.write(args.process_index)

    return leave_weights_alone(Window, "counters only")()


# --------------------------------------------------------------------------- arms that take turns (--turns)


class Turns:
    """The arms of a round started together take turns: one arm's processes run `steps` optimizer steps while every
    other arm's processes wait, blocked reading a FIFO (no CPU used), then the turn goes to the next arm still
    training. A slow phase of the machine (seconds to tens of seconds on this VM) then falls on every arm alike,
    where arms run one after another each meet their own. The wait is in `on_step_end` after the throughput
    callback's mark and before the next step's `on_step_begin`: outside every timed step. An arm that has run all
    its steps waits for the others before its evaluation, which would otherwise run beside their last steps. The
    throughput report is paused over the wait (`ThroughputCallback.pause`): the step after a turn's wait is not
    measured. Counted in it, the wait (tenths of a second) was the data wait of one step in `steps`, and with
    `steps` 5 the median of the step times was the 62nd percentile of the steps that did not wait."""

    def __init__(self, folder: str, arm: int, arms: int, ranks: int, steps: int):
        self.folder, self.arm, self.arms, self.ranks, self.steps = folder, arm, arms, ranks, steps
        self.done = 0

    @staticmethod
    def prepare(folder: str, arms: int, ranks: int) -> None:
        """One FIFO per process (its turn arrives there) and one per arm (its other ranks' steps are done)."""
        for arm in range(arms):
            os.mkfifo(os.path.join(folder, f"arm{arm}.done"))
            for rank in range(ranks):
                os.mkfifo(os.path.join(folder, f"arm{arm}.rank{rank}"))

    def _fifo(self, name: str) -> int:
        return os.open(os.path.join(self.folder, name), os.O_RDWR)  # O_RDWR: opening never blocks (Linux)

    def _marked(self, kind: str) -> int:
        return sum(name.startswith(kind) for name in os.listdir(self.folder))

    def _mark(self, kind: str, rank: int | None = None) -> None:
        suffix = f".rank{rank}" if rank is not None else ""
        open(os.path.join(self.folder, f"{kind}.arm{self.arm}{suffix}"), "w").close()

    def _poll(self, kind: str, count: int) -> None:
        while self._marked(kind) < count:
            time.sleep(0.01)

    def start(self, rank: int) -> None:
        """Every process of every arm ready (engines built), then arm 0 first. Each process keeps its FIFOs open
        from here on: a byte written to a FIFO nobody holds open is lost."""
        self.rank, self.own = rank, self._fifo(f"arm{self.arm}.rank{rank}")
        self.done_fifo = self._fifo(f"arm{self.arm}.done")
        self._mark("ready", rank)
        if self.arm == 0 and rank == 0:
            self._poll("ready", self.arms * self.ranks)
            self._give(0)
        os.read(self.own, 1)

    def _give(self, arm: int) -> None:
        for rank in range(self.ranks):
            fifo = self._fifo(f"arm{arm}.rank{rank}")
            os.write(fifo, b"t")
            os.close(fifo)

    def step_ended(self, last: bool) -> bool:
        """Count a step; at a turn's end, pass the turn on and wait for the next. Whether it waited."""
        self.done += 1
        if not last and self.done % self.steps:
            return False
        if self.rank == 0:  # the arm's other ranks finished these steps too, then the turn goes on
            for _ in range(self.ranks - 1):
                os.read(self.done_fifo, 1)
            if last:
                self._mark("finished")
            after = [(self.arm + i) % self.arms for i in range(1, self.arms + 1)]
            waiting = [a for a in after if not os.path.exists(os.path.join(self.folder, f"finished.arm{a}"))]
            if waiting:
                self._give(waiting[0])
        else:
            os.write(self.done_fifo, b"d")
        if last:
            self._poll("finished", self.arms)
        else:
            os.read(self.own, 1)
        return True


def TurnTaking(turns: Turns):  # noqa: N802 (a TrainerCallback made where transformers is imported)
    from transformers import TrainerCallback

    from hf_vit_scaling.parallel.fast_paths.weight_gathers import leave_weights_alone
    from hf_vit_scaling.throughput.timing import ThroughputCallback

    class Taking(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            turns.start(args.process_index)

        def on_step_end(self, args, state, control, **kwargs):
            if not turns.step_ended(last=state.global_step >= state.max_steps):
                return
            for callback in self.trainer.callback_handler.callbacks:
                if isinstance(callback, ThroughputCallback):
                    callback.pause()  # the turn's wait is no step's data wait

    return leave_weights_alone(Taking, "a FIFO and a turn")()


def add_callback_to_every_trainer(callback) -> None:
    """`callback` added to every Trainer the recipe builds, with that Trainer as its `trainer`."""
    import transformers

    original_init = transformers.Trainer.__init__

    def init_with(trainer, *a, **k):
        original_init(trainer, *a, **k)
        callback.trainer = trainer
        trainer.add_callback(callback)

    transformers.Trainer.__init__ = init_with


def probe(args, recipe: list[str]) -> None:
    """Run the recipe in this process (the launcher started this script per rank) with `Counters` installed
    (`--probe`) or taking turns with the other arms of its round (`--turns`)."""
    if args.probe:
        counters = Counters(args.probe_warmup, args.probe)
        counters.install()
    if args.turns:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        add_callback_to_every_trainer(TurnTaking(Turns(args.turns, args.arm, args.arms, world, args.turn_steps)))
    sys.argv = recipe
    sys.path.insert(0, str(REPO / "recipes"))
    runpy.run_path(recipe[0], run_name="__main__")


# --------------------------------------------------------------------------- rounds and summary


def arms(args) -> list[tuple[str, int]]:
    return [(name, n) for n in args.processes for name in args.engines if n == 2 or name not in TWO_PROCESSES_ONLY]


def measure(args) -> dict:
    """`args.rounds` rounds of every arm (the order reversed every other round), then one counted run per arm."""
    rounds = []
    for index in range(args.rounds):
        order = arms(args) if index % 2 == 0 else arms(args)[::-1]
        record = {}
        if args.turn_steps:  # the arms of each world size at once, taking turns
            for nproc in dict.fromkeys(n for _, n in order):
                together = run_together(args, [name for name, n in order if n == nproc], nproc)
                record.update({f"{name}@{nproc}": step_s for name, step_s in together.items()})
        else:
            for name, nproc in order:
                record[f"{name}@{nproc}"] = run_arm(args, name, nproc)["step_s"]
        for key in (f"{name}@{nproc}" for name, nproc in order):
            print(f"round {index + 1} {key}: {record[key] * 1000:.1f} ms", file=sys.stderr)
        rounds.append(record)
    summary = {}
    for name, nproc in arms(args):
        key, base = f"{name}@{nproc}", f"plain@{nproc}"
        summary[key] = {"step_s": statistics.median(r[key] for r in rounds),
                        "ratio_to_plain": statistics.median(r[key] / r[base] for r in rounds)}  # fmt: skip
    counts = {}
    for name, nproc in arms(args) if args.count_steps else []:
        counted = run_arm(args, name, nproc, count=True)
        counts[f"{name}@{nproc}"] = {
            "per_rank": counted["counts_per_step"],
            "resolved": counted["resolved"],
            "fast_paths": counted["fast_paths"],
        }
        print(f"counted {name} x{nproc}: {counted['counts_per_step'][0]}", file=sys.stderr)
    vit_b = {}
    for name in ("zero2_auto", "zero2", "zero3_auto", "zero3") if args.vit_b16 else ():
        counted = run_arm(args, name, 1, count=True, model=("vit-b-16", 224, 1))
        vit_b[name] = {"per_rank": counted["counts_per_step"], "resolved": counted["resolved"]}
        print(f"ViT-B/16 {name}: {counted['counts_per_step'][0]}", file=sys.stderr)
    return {"median_over_rounds": summary, "rounds": rounds, "counts": counts, "vit_b16_counts": vit_b}


def parse(argv=None) -> tuple[argparse.Namespace, list[str]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    recipe = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_preset", default="vit-tiny-cpu", help="Preset of the timed arms.")
    parser.add_argument("--hidden", type=int, default=96, help="The preset's hidden size (for the 'auto' arms).")
    parser.add_argument("--image_size", type=int, default=16, help="Input side in pixels.")
    parser.add_argument("--batch_size", type=int, default=32, help="Global batch per step (split over processes).")
    parser.add_argument("--steps", type=int, default=60, help="Timed optimizer steps per arm, after the warm-up.")
    parser.add_argument("--warmup", type=int, default=10, help="Steps dropped before the timed ones.")
    parser.add_argument("--count_steps", type=int, default=10, help="Counted steps per arm (0: no counted runs).")
    parser.add_argument("--threads", type=int, default=2, help="torch threads in all, split over the processes.")
    parser.add_argument("--rounds", type=int, default=3, help="Rounds; every arm runs once per round.")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2], choices=[1, 2], help="World sizes.")
    parser.add_argument("--engines", nargs="+", default=list(CONFIGS), choices=list(CONFIGS), help="Arms to run.")
    parser.add_argument(
        "--turn_steps",
        type=int,
        default=5,
        help="Start the arms of a world size together and let them take turns this many steps at a "
        "time (a slow phase of the machine falls on all alike); 0: run them one after another.",
    )
    parser.add_argument("--vit_b16", action="store_true", help="Also count ZeRO-2/3 on ViT-B/16's tensors.")
    parser.add_argument("--output", default=None, help="Write the result as JSON here.")
    parser.add_argument("--probe", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--probe_warmup", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--turns", default=None, help=argparse.SUPPRESS)  # the arm processes' side of --turn_steps
    parser.add_argument("--arm", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--arms", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe is None and "plain" not in args.engines:
        parser.error("--engines must include plain: every ratio is to the same round's plain Trainer.")
    return args, recipe


def main(argv=None) -> None:
    args, recipe = parse(argv)
    if args.probe or args.turns:
        probe(args, recipe)
        return
    setup = {"model_preset": args.model_preset, "image_size": args.image_size, "global_batch": args.batch_size,
             "steps": args.steps, "warmup_dropped": args.warmup, "threads": args.threads, "precision": "fp32",
             "rounds": args.rounds, "timed": "throughput.json step_time_s.median (rank 0)",
             "order": (f"the arms of a world size started together, taking turns {args.turn_steps} steps at a time, "
                       "the order reversed every other round") if args.turn_steps else
                      "arms one after another, the order reversed every other round"}  # fmt: skip
    report_result({"setup": setup, **measure(args)}, args.output)


if __name__ == "__main__":
    main()
