"""The throughput report: one `TrainerCallback` that measures images/s, step time, FLOPs/MFU, memory and stragglers.

What is timed (per rank, wall clock, accelerator synchronised at each boundary):
- step compute: `on_step_begin` -> `on_step_end` of one optimizer step (all micro-batches, backward, optimizer);
- data wait: previous `on_step_end` -> `on_step_begin` (the Trainer fetches the step's batches there); intervals
  that contain an evaluation or a checkpoint save are excluded;
- forward: the model's forward pass (pre/post hooks), used to estimate each rank's own work at the gradient sync.
Images are counted as they enter the model's forward in training mode, on every rank, so uneven or short last
batches are counted as they are. The first `warmup_steps` optimizer steps are excluded from every figure.

`throughput.json` schema (version 1), read by the scaling tools:
  schema_version: 1
  setup:      world_size, num_nodes, per_device_train_batch_size, gradient_accumulation_steps, global_batch_size,
              zero_stage (null without DeepSpeed), offload {state: device}, precision, image_size, patch_size,
              tokens_per_image, num_parameters, devices [names], hostnames, versions {torch, transformers,
              deepspeed}, simulated_slow_ranks {rank: factor} (a SIMULATION when non-empty), rank_batches
              (per-rank micro-batches when balanced, else null), sequence_parallel_size (N ranks per image),
              tokens_per_rank (ceil(tokens / N))
  throughput: images_per_s, images_per_s_per_device, images_measured, steps_measured, warmup_steps,
              measured_time_s, nominal_images_per_step (per-device batch x accumulation x world size)
  step_time_s: mean, median, p90 (consecutive step ends), compute_mean, data_wait_mean, data_wait_fraction,
              est_sync_and_optimizer_mean (compute - 3 x forward)
  flops:      forward_macs_per_image, train_flops_per_image (3 x 2 x MACs), achieved_tflops_per_device,
              achieved_tflops_total, peak_tflops_per_device, peak_source (user | table | matmul-probe | none), mfu
  memory:     per_rank [{rank, allocated_peak_bytes, reserved_peak_bytes, rss_peak_bytes}], max_bytes, kind
  ranks:      per_rank [{rank, hostname, device, images, step_compute_mean_s, forward_mean_s, data_wait_mean_s,
              est_own_work_mean_s, est_sync_wait_s, est_sync_wait_fraction}], fastest_rank, slowest_rank,
              spread (slowest / fastest own work), est_sync_wait_s_total
"""

import json
import os
import platform
import resource
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist
from transformers import TrainerCallback

from .deepspeed_config import offload_targets, zero_stage
from .flops import (
    lookup_peak_tflops,
    measure_matmul_peak_tflops,
    mfu,
    precision_name,
    vit_forward_macs_per_image,
    vit_train_flops_per_image,
)
from .models import count_parameters

SCHEMA_VERSION = 1
REPORT_FILENAME = "throughput.json"
# Keys of each section of throughput.json (schema version 1); README "Throughput report" explains each one.
REPORT_SCHEMA = {
    "setup": ["world_size", "num_nodes", "per_device_train_batch_size", "gradient_accumulation_steps",
              "global_batch_size", "zero_stage", "offload", "precision", "image_size", "patch_size", "tokens_per_image",
              "num_parameters", "devices", "hostnames", "versions", "simulated_slow_ranks", "rank_batches",
              "sequence_parallel_size", "tokens_per_rank"],
    "throughput": ["images_per_s", "images_per_s_per_device", "images_measured", "steps_measured", "warmup_steps",
                   "measured_time_s", "nominal_images_per_step"],
    "step_time_s": ["mean", "median", "p90", "compute_mean", "data_wait_mean", "data_wait_fraction",
                    "est_sync_and_optimizer_mean"],
    "flops": ["forward_macs_per_image", "train_flops_per_image", "achieved_tflops_per_device", "achieved_tflops_total",
              "peak_tflops_per_device", "peak_source", "mfu"],
    "memory": ["per_rank", "kind", "max_bytes"],
    "ranks": ["per_rank", "fastest_rank", "slowest_rank", "spread", "est_sync_wait_s_total"],
}
MAX_STEPS_GATHERED = 20_000  # per-step arrays beyond this are trimmed to the last steps before gathering


def _sync(device_type: str) -> None:
    if device_type == "cuda":
        torch.cuda.synchronize()


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _mean(values: list[float]) -> float | None:
    return float(statistics.fmean(values)) if values else None


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def gather_object(obj) -> list:
    """Every rank's `obj`, in rank order (a collective: call on all ranks); [obj] without a process group."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        out = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj)
        return out
    return [obj]


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def _versions() -> dict:
    import transformers

    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    try:
        import deepspeed

        versions["deepspeed"] = deepspeed.__version__
    except ImportError:
        versions["deepspeed"] = None
    return versions


def estimate_sync_wait(work_per_rank: list[list[float]]) -> list[float]:
    """Seconds each rank waits at gradient synchronisation, summed over steps.

    At every step all ranks leave the all-reduce together, so a rank waits for the slowest one:
    wait[r] = sum over steps of (max_r' work[r'][s] - work[r][s]).
    """
    work = np.asarray(work_per_rank, dtype=np.float64)  # (ranks, steps)
    if work.size == 0:
        return [0.0] * len(work_per_rank)
    return (work.max(axis=0, keepdims=True) - work).sum(axis=1).tolist()


class ThroughputCallback(TrainerCallback):
    """Measures training speed and writes the throughput report (see the module docstring for what is timed)."""

    def __init__(self, warmup_steps: int = 5, peak_tflops: float | None = None, ds_config: dict | None = None,
                 slow_ranks: dict[int, float] | None = None, rank_batches: list[int] | None = None,
                 print_table: bool = True, sequence_parallel_size: int = 1):
        self.warmup_steps = warmup_steps
        self.user_peak_tflops = peak_tflops
        self.ds_config = ds_config
        self.slow_ranks = slow_ranks or {}  # for the label only: SlowRankSimulator does the slowing
        self.rank_batches = rank_batches
        self.print_table = print_table
        self.sp = sequence_parallel_size  # N ranks share each image: every image is counted on N ranks
        self.report: dict | None = None
        self._hooks = []
        self._reset()

    def _reset(self):
        self.step_ends: list[float] = []       # time of each on_step_end
        self.compute: list[float] = []          # on_step_begin -> on_step_end
        self.data_wait: list[float] = []        # previous on_step_end -> on_step_begin (nan when excluded)
        self.forward: list[float] = []          # forward seconds within each step
        self.images: list[int] = []             # images that entered forward within each step
        self.excluded_before: list[bool] = []   # an eval/save happened before this step began
        self._step_begin = self._last_end = None
        self._paused = False
        self._fwd_start = self._fwd_time = 0.0
        self._step_images = 0

    # ------------------------------------------------------------------ hooks on the model

    def _attach_hooks(self, model: torch.nn.Module):
        """Count training images and time the forward. A `SlowRankSimulator` attached earlier runs inside this
        window, so simulated slowness shows in the forward time as real slowness would."""

        def pre_hook(module, args, kwargs):
            if module.training:
                pixel_values = kwargs.get("pixel_values", args[0] if args else None)
                if pixel_values is not None:
                    self._step_images += int(pixel_values.shape[0])
                _sync(self.device_type)
                self._fwd_start = time.perf_counter()

        def post_hook(module, args, kwargs, output):
            if module.training:
                _sync(self.device_type)
                self._fwd_time += time.perf_counter() - self._fwd_start
            return output

        self._hooks = [model.register_forward_pre_hook(pre_hook, with_kwargs=True, prepend=True),
                       model.register_forward_hook(post_hook, with_kwargs=True)]

    # ------------------------------------------------------------------ Trainer events

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._reset()
        self.rank, self.world_size = _world()
        self.device = args.device
        self.device_type = args.device.type
        self.args = args
        self.model = model
        if model is not None:
            self._attach_hooks(model)
        if self.device_type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.peak_tflops, self.peak_source = self._peak(args)

    def _peak(self, args) -> tuple[float | None, str]:
        precision = precision_name(args.bf16, args.fp16, args.tf32)
        if self.user_peak_tflops:
            return self.user_peak_tflops, "user"
        if self.device_type == "cuda":
            peak = lookup_peak_tflops(torch.cuda.get_device_name(self.device), precision)
            return (peak, "table") if peak else (None, "none")
        if self.device_type == "cpu":
            dtype = torch.bfloat16 if precision == "bf16" else torch.float32
            return measure_matmul_peak_tflops("cpu", dtype=dtype), "matmul-probe"
        return None, "none"

    def on_step_begin(self, args, state, control, **kwargs):
        _sync(self.device_type)
        now = time.perf_counter()
        excluded = self._paused or self._last_end is None
        self.data_wait.append(float("nan") if excluded else now - self._last_end)
        self.excluded_before.append(excluded)
        self._step_begin, self._paused = now, False
        self._fwd_time, self._step_images = 0.0, 0

    def on_step_end(self, args, state, control, **kwargs):
        if self._step_begin is None:
            return
        _sync(self.device_type)
        now = time.perf_counter()
        self.compute.append(now - self._step_begin)
        self.forward.append(self._fwd_time)
        self.images.append(self._step_images)
        self.step_ends.append(now)
        self._last_end = now

    def on_evaluate(self, args, state, control, **kwargs):
        self._paused = True

    def on_save(self, args, state, control, **kwargs):
        self._paused = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        """Add running figures to training logs (this callback runs first, so TensorBoard & co. receive them)."""
        if logs is None or "loss" not in logs:
            return
        live = self._rate_figures()
        if live["images_per_s"] is not None:
            logs["throughput/images_per_s"] = round(live["images_per_s"] * self.world_size / self.sp, 2)
            if live["step_time_median"] is not None:  # None when every measured step followed a save/eval
                logs["throughput/step_time_s"] = round(live["step_time_median"], 5)
            if self.peak_tflops and self.model is not None:
                tflops = live["images_per_s"] / self.sp * vit_train_flops_per_image(self.model.config) / 1e12
                logs["throughput/mfu"] = round(tflops / self.peak_tflops, 5)

    def on_train_end(self, args, state, control, **kwargs):
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        self.report = self.build_report(args)
        if state.is_world_process_zero:
            os.makedirs(args.output_dir, exist_ok=True)
            with open(os.path.join(args.output_dir, REPORT_FILENAME), "w", encoding="utf-8") as f:
                json.dump(self.report, f, indent=2)
            if self.print_table:
                print("\n" + format_report(self.report), flush=True)  # on its own lines after the progress bar

    # ------------------------------------------------------------------ figures

    def _measured_steps(self) -> list[int]:
        """Indices of the steps after warm-up (an interval with an eval/save before a step counts no data wait)."""
        return [i for i in range(self.warmup_steps, len(self.compute))]

    def _rate_figures(self) -> dict:
        """What the training logs need, on every logging step: images/s and step times of this rank."""
        idx = self._measured_steps()
        step_times = [self.compute[i] + self.data_wait[i] for i in idx if not self.excluded_before[i]]
        measured_time = sum(self.compute[i] + (0.0 if self.excluded_before[i] else self.data_wait[i]) for i in idx)
        images = sum(self.images[i] for i in idx)
        return {
            "steps": len(idx),
            "images": images,
            "measured_time": measured_time,
            "images_per_s": images / measured_time if measured_time > 0 else None,
            "step_times": step_times,
            "step_time_median": statistics.median(step_times) if step_times else None,
        }

    def _local_figures(self) -> dict:
        """Everything this rank contributes to the final report (gathered to the main process)."""
        rates = self._rate_figures()
        idx = self._measured_steps()
        step_times = rates.pop("step_times")
        waits = [self.data_wait[i] for i in idx if not self.excluded_before[i]]
        return {
            **rates,
            "step_time_mean": _mean(step_times),
            "step_time_p90": _percentile(step_times, 90),
            "compute_mean": _mean([self.compute[i] for i in idx]),
            "data_wait_mean": _mean(waits),
            "forward_mean": _mean([self.forward[i] for i in idx]),
            # Own work before the gradient sync: data wait + forward + backward, backward ~ 2x forward
            # (Kaplan et al. 2020, sec. 2.1: training ~ 3x forward FLOPs).
            "own_work": [(0.0 if self.excluded_before[i] else self.data_wait[i]) + 3.0 * self.forward[i]
                         for i in idx][-MAX_STEPS_GATHERED:],
            "memory": self._memory(),
            "device": _device_name(self.device),
            "hostname": platform.node(),
            # torchrun/accelerate export the node's rank as GROUP_RANK (NODE_RANK for some launchers): two "nodes"
            # on one host still count as two.
            "node": f"{platform.node()}#{os.environ.get('GROUP_RANK', os.environ.get('NODE_RANK', '0'))}",
        }

    def _memory(self) -> dict:
        rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
        if self.device_type == "cuda":
            return {"allocated_peak_bytes": torch.cuda.max_memory_allocated(self.device),
                    "reserved_peak_bytes": torch.cuda.max_memory_reserved(self.device), "rss_peak_bytes": rss_peak}
        return {"allocated_peak_bytes": None, "reserved_peak_bytes": None, "rss_peak_bytes": rss_peak}

    def build_report(self, args) -> dict:
        local = self._local_figures()
        per_rank = gather_object(local)
        world = len(per_rank)
        config = self.model.config
        measured_time = max(r["measured_time"] for r in per_rank)
        images = sum(r["images"] for r in per_rank) // self.sp  # each image entered forward on its N SP ranks
        images_per_s = images / measured_time if measured_time > 0 else None
        train_flops = vit_train_flops_per_image(config)
        achieved_total = images_per_s * train_flops / 1e12 if images_per_s else None
        achieved_per_device = achieved_total / world if achieved_total is not None else None

        waits = estimate_sync_wait([r["own_work"] for r in per_rank])
        own_means = [_mean(r["own_work"]) or 0.0 for r in per_rank]
        rank_rows = []
        for rank, (r, wait, own) in enumerate(zip(per_rank, waits, own_means)):
            rank_rows.append({
                "rank": rank, "hostname": r["hostname"], "device": r["device"], "images": r["images"],
                "step_compute_mean_s": r["compute_mean"], "forward_mean_s": r["forward_mean"],
                "data_wait_mean_s": r["data_wait_mean"], "est_own_work_mean_s": own, "est_sync_wait_s": wait,
                "est_sync_wait_fraction": wait / r["measured_time"] if r["measured_time"] > 0 else None,
            })
        fastest = int(np.argmin(own_means)) if own_means else 0
        slowest = int(np.argmax(own_means)) if own_means else 0

        memory_rows = [{"rank": i, **r["memory"]} for i, r in enumerate(per_rank)]
        memory_key = "allocated_peak_bytes" if self.device_type == "cuda" else "rss_peak_bytes"
        image_size = config.image_size if isinstance(config.image_size, int) else config.image_size[0]
        patch_size = config.patch_size if isinstance(config.patch_size, int) else config.patch_size[0]
        gas = args.gradient_accumulation_steps
        main = per_rank[0]
        return {
            "schema_version": SCHEMA_VERSION,
            "setup": {
                "world_size": world,
                "num_nodes": len({r["node"] for r in per_rank}),
                "per_device_train_batch_size": args.per_device_train_batch_size,
                "gradient_accumulation_steps": gas,
                "global_batch_size": args.per_device_train_batch_size * gas * world // self.sp,
                "zero_stage": zero_stage(self.ds_config),
                "offload": offload_targets(self.ds_config),
                "precision": precision_name(args.bf16, args.fp16, args.tf32),
                "image_size": image_size,
                "patch_size": patch_size,
                "tokens_per_image": (image_size // patch_size) ** 2 + 1,
                "num_parameters": count_parameters(self.model),
                "devices": sorted({r["device"] for r in per_rank}),
                "hostnames": sorted({r["hostname"] for r in per_rank}),
                "versions": _versions(),
                "simulated_slow_ranks": {str(k): v for k, v in self.slow_ranks.items()},
                "rank_batches": self.rank_batches,
                "sequence_parallel_size": self.sp,
                "tokens_per_rank": -(-((image_size // patch_size) ** 2 + 1) // self.sp),
            },
            "throughput": {
                "images_per_s": images_per_s,
                "images_per_s_per_device": images_per_s / world if images_per_s else None,
                "images_measured": images,
                "steps_measured": main["steps"],
                "warmup_steps": self.warmup_steps,
                "measured_time_s": measured_time,
                "nominal_images_per_step": args.per_device_train_batch_size * gas * world // self.sp,
            },
            "step_time_s": {
                "mean": main["step_time_mean"], "median": main["step_time_median"], "p90": main["step_time_p90"],
                "compute_mean": main["compute_mean"], "data_wait_mean": main["data_wait_mean"],
                "data_wait_fraction": (main["data_wait_mean"] / main["step_time_mean"]
                                       if main["data_wait_mean"] is not None and main["step_time_mean"] else None),
                # compute - 3 x forward: gradient communication (incl. waiting), optimizer step, ZeRO gathers.
                "est_sync_and_optimizer_mean": (main["compute_mean"] - 3.0 * main["forward_mean"]
                                                if main["compute_mean"] is not None else None),
            },
            "flops": {
                "forward_macs_per_image": vit_forward_macs_per_image(config),
                "train_flops_per_image": train_flops,
                "achieved_tflops_per_device": achieved_per_device,
                "achieved_tflops_total": achieved_total,
                "peak_tflops_per_device": self.peak_tflops,
                "peak_source": self.peak_source,
                "mfu": mfu(achieved_per_device, self.peak_tflops) if achieved_per_device is not None else None,
            },
            "memory": {"per_rank": memory_rows, "kind": memory_key,
                       "max_bytes": max((m[memory_key] or 0) for m in memory_rows)},
            "ranks": {
                "per_rank": rank_rows, "fastest_rank": fastest, "slowest_rank": slowest,
                "spread": own_means[slowest] / own_means[fastest] if own_means and own_means[fastest] > 0 else None,
                "est_sync_wait_s_total": float(sum(waits)),
            },
        }


def _fmt(value, spec: str = ".3g", unit: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{unit}"


def format_report(report: dict) -> str:
    """A readable table of the report, printed once by the main process."""
    s, t, st, fl, mem, rk = (report[k] for k in ("setup", "throughput", "step_time_s", "flops", "memory", "ranks"))
    sp = s.get("sequence_parallel_size", 1)  # reports written before sequence parallelism lack the key
    zero = "none (plain Trainer)" if s["zero_stage"] is None else f"ZeRO-{s['zero_stage']}"
    if s["offload"]:
        zero += " + offload " + ", ".join(f"{k}->{v}" for k, v in s["offload"].items())
    lines = [
        "=" * 78,
        "Throughput report" + ("   [SIMULATED slow ranks: " + str(s["simulated_slow_ranks"]) + "]"
                               if s["simulated_slow_ranks"] else ""),
        "-" * 78,
        f"setup        {s['world_size']} process(es) on {s['num_nodes']} node(s), {zero}, {s['precision']}, "
        f"{s['image_size']} px / patch {s['patch_size']} ({s['tokens_per_image']} tokens), "
        f"{s['num_parameters'] / 1e6:.2f} M params"
        + (f"; sequence parallel over {s['sequence_parallel_size']} ranks ({s['tokens_per_rank']} tokens per rank)"
           if sp > 1 else ""),
        f"batch        {s['per_device_train_batch_size']} per device x {s['gradient_accumulation_steps']} accumulation "
        f"x {s['world_size'] // sp}{f' SP groups of {sp} ranks' if sp > 1 else ''} = {s['global_batch_size']} images "
        "per optimizer step"
        + (f" (balanced per rank: {s['rank_batches']})" if s["rank_batches"] else ""),
        f"images/s     {_fmt(t['images_per_s'], '.1f')} total, {_fmt(t['images_per_s_per_device'], '.1f')} per device "
        f"({t['images_measured']} images over {t['steps_measured']} steps, first {t['warmup_steps']} excluded)",
        f"step time    mean {_fmt(st['mean'], '.4f', ' s')}, median {_fmt(st['median'], '.4f', ' s')}, "
        f"p90 {_fmt(st['p90'], '.4f', ' s')}; compute {_fmt(st['compute_mean'], '.4f', ' s')} (of which est. "
        f"sync + optimizer {_fmt(st['est_sync_and_optimizer_mean'], '.4f', ' s')}), data wait "
        f"{_fmt(st['data_wait_mean'], '.4f', ' s')}",
        f"FLOPs        {fl['forward_macs_per_image'] / 1e9:.3f} GMACs forward/image, "
        f"{fl['train_flops_per_image'] / 1e9:.3f} GFLOP train/image; achieved "
        f"{_fmt(fl['achieved_tflops_per_device'], '.4g')} TFLOP/s per device; peak "
        f"{_fmt(fl['peak_tflops_per_device'], '.4g')} ({fl['peak_source']}); MFU {_fmt(fl['mfu'], '.1%')}",
        f"memory       peak {mem['max_bytes'] / 2**20:.0f} MiB per device ({mem['kind']})",
        f"ranks        fastest {rk['fastest_rank']}, slowest {rk['slowest_rank']}, spread "
        f"{_fmt(rk['spread'], '.2f', 'x')}, est. wait at gradient sync {rk['est_sync_wait_s_total']:.2f} s in all",
    ]
    for row in rk["per_rank"]:
        lines.append(
            f"  rank {row['rank']:<3} {row['hostname'][:16]:<16} work/step {_fmt(row['est_own_work_mean_s'], '.4f', ' s')}"
            f"  waits {_fmt(row['est_sync_wait_s'], '.2f', ' s')} ({_fmt(row['est_sync_wait_fraction'], '.0%')})"
            f"  images {row['images']}"
        )
    lines.append("=" * 78)
    return "\n".join(lines)


def add_throughput_callback(trainer, **kwargs) -> ThroughputCallback:
    """Attach the report to a Trainer. It goes first in the callback list so that the figures it adds to the logs
    (`on_log`) reach the reporting integrations (TensorBoard, W&B, ...) that run after it."""
    callback = ThroughputCallback(**kwargs)
    trainer.callback_handler.callbacks.insert(0, callback)
    return callback


def load_throughput_report(path: str) -> dict:
    """Read a throughput.json, checking its schema version and sections (for the scaling tools)."""
    with open(path, encoding="utf-8") as f:
        report = json.load(f)
    if report.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"{path}: throughput report schema {report.get('schema_version')} != {SCHEMA_VERSION}")
    setup = report.get("setup", {})
    if "tokens_per_image" in setup:  # written before sequence parallelism: one rank per image
        setup.setdefault("sequence_parallel_size", 1)
        setup.setdefault("tokens_per_rank", setup["tokens_per_image"])
    missing = [f"{section}.{key}" for section, keys in REPORT_SCHEMA.items() for key in keys
               if key not in report.get(section, {})]
    if missing:
        raise ValueError(f"{path}: throughput report lacks {', '.join(missing)}")
    return report
