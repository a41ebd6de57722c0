"""`ThroughputCallback`: times each optimizer step on every rank and writes the throughput report at the end.

What is timed (per rank; on a GPU on the device's own timeline, between CUDA events recorded at each boundary and
read once per logging window, so timing never stalls the launch queue; elsewhere with the wall clock):
- step compute: `on_step_begin` -> `on_step_end` of one optimizer step (all micro-batches, backward, optimizer);
- data wait: previous `on_step_end` -> `on_step_begin` (the Trainer fetches the step's batches there); intervals
  that contain an evaluation or a checkpoint save are excluded;
- input hooks: from the forward's first model-level pre-hook to its last (device preprocessing, batch augmentation:
  work on the input that has no backward);
- forward: the model's own forward, from the last model-level pre-hook to the last post-hook; its backward costs
  ~2x as much, so data wait + input hooks + 3 x forward estimates each rank's own work at the gradient sync.
Images are counted as they enter the model's forward in training mode, on every rank, so uneven or short last
batches are counted as they are. The first `warmup_steps` optimizer steps are excluded from every figure.
Under `--torch_compile` dynamo's counters are read around every step (`compilation.CompileWatch`): the report says
whether the model was really compiled, how many graphs and recompilations, and whether the compile time fell inside
the warm-up steps.

This module only measures. `summary.summarize` turns the gathered figures into the report, `report.format_report`
prints it, `schema.REPORT_SCHEMA` says what every key means.
"""

import json
import os
import platform
import statistics
import time

import numpy as np
import torch
from transformers import TrainerCallback

from hf_vit_scaling.log import logger
from hf_vit_scaling.models.flops import (
    as_pair,
    device_peak_tflops,
    forward_flops_per_image,
    forward_macs_per_image,
    has_patches,
    precision_name,
    tokens_per_image,
    train_flops_per_image,
)
from hf_vit_scaling.models.presets import count_parameters
from hf_vit_scaling.parallel.distributed import gather_object, rank_and_world
from hf_vit_scaling.throughput.compilation import CompileWatch
from hf_vit_scaling.throughput.report import format_report
from hf_vit_scaling.throughput.schema import REPORT_FILENAME
from hf_vit_scaling.throughput.summary import summarize
from hf_vit_scaling.utils import peak_rss_bytes

MAX_STEPS_GATHERED = 20_000  # per-step arrays beyond this are trimmed to the last steps before gathering


class StepMarks:
    """Time points at the step's boundaries, read later: on CUDA, events recorded on the current stream (no host
    wait: `mark` returns at once) and resolved by `seconds` after one `synchronize` of the last event, once per
    logging window (`ThroughputCallback.flush`); elsewhere `time.perf_counter()`."""

    def __init__(self, device_type: str):
        self.on_cuda = device_type == "cuda"

    def mark(self):
        if not self.on_cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def wait_for(self, last) -> None:
        """The one host wait of a window: until the last mark has happened on the device."""
        if self.on_cuda and last is not None:
            last.synchronize()

    def seconds(self, start, end) -> float:
        return start.elapsed_time(end) / 1000.0 if self.on_cuda else end - start


def _mean(values: list[float]) -> float | None:
    return float(statistics.fmean(values)) if values else None


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


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


def _memory(device_type: str, device) -> dict:
    rss_peak = peak_rss_bytes()  # this rank's own peak, not its launcher's
    if device_type == "cuda":
        return {
            "allocated_peak_bytes": torch.cuda.max_memory_allocated(device),
            "reserved_peak_bytes": torch.cuda.max_memory_reserved(device),
            "rss_peak_bytes": rss_peak,
        }
    return {"allocated_peak_bytes": None, "reserved_peak_bytes": None, "rss_peak_bytes": rss_peak}


class ThroughputCallback(TrainerCallback):
    """Measures training speed on every rank; the main process writes and prints the report at the end.

    `engine` is a `parallel.engine.Engine` (None: the plain Trainer). `slow_ranks` only labels the report:
    `SlowRankSimulator` does the slowing. With `sequence_parallel_size` N every image enters forward on N ranks and
    is counted once. `teacher_config`: a distillation teacher's config; its forward FLOPs per image (no backward: it
    runs under `no_grad`) are counted beside the student's training FLOPs in the achieved TFLOP/s and MFU.
    """

    def __init__(
        self,
        warmup_steps: int = 5,
        peak_tflops: float | None = None,
        engine=None,
        slow_ranks: dict[int, float] | None = None,
        rank_batches: list[int] | None = None,
        print_table: bool = True,
        sequence_parallel_size: int = 1,
        teacher_config=None,
    ):
        self.warmup_steps = warmup_steps
        self.user_peak_tflops = peak_tflops
        self.engine = engine
        self.slow_ranks = slow_ranks or {}
        self.rank_batches = rank_batches
        self.print_table = print_table
        self.sp = sequence_parallel_size
        self.teacher_config = teacher_config
        self.report: dict | None = None
        self._hooks = []
        self._reset()

    def _reset(self):
        self.compute: list[float] = []  # on_step_begin -> on_step_end
        self.data_wait: list[float] = []  # previous on_step_end -> on_step_begin (nan when excluded)
        self.forward: list[float] = []  # model forward seconds within each step (input hooks excluded)
        self.inputs: list[float] = []  # seconds in the input pre-hooks within each step
        self.images: list[int] = []  # images that entered forward within each step
        self.excluded_before: list[bool] = []  # an eval/save happened before this step began
        self.compile_watch = CompileWatch()  # graphs dynamo compiled within each step
        self._step_begin = self._last_end = None
        self._paused = False
        self._step_images = 0
        self._pending_forwards: list[list] = []  # this step's [start, inputs ready, end] marks per forward
        self._unread: list[tuple] = []  # finished steps whose marks `flush` has not read yet
        self._fast_paths_before: dict[str, int] | None = None  # DeepSpeed's fast paths' runs at the measured start

    # ------------------------------------------------------------------ hooks on the model

    def attach(self, model: torch.nn.Module) -> None:
        """Count training images and time the input hooks and the forward. The first pre-hook is prepended, so it
        runs before every other model hook (see `model_hooks`); the second is appended when training begins, after
        the recipe's hooks are attached, so it runs after all of them. Between the two: device-side preprocessing
        and batch augmentation, which have no backward: counted as forward, 3 x forward would exceed the step (a
        negative sync + optimizer estimate). After the second: the model's forward and a simulated slow rank's
        sleep (whose backward sleeps 2x as long). The hooks run eagerly under `torch.compile`
        (`torch.compiler.disable`): traced, dynamo guarded on the host time in the marks list and compiled the hooks
        again at every step ('Recompiling function inputs_ready_hook ... self._pending_forwards[0][0] == 14968.33')."""

        @torch.compiler.disable
        def pre_hook(module, args, kwargs):
            if module.training:
                pixel_values = kwargs.get("pixel_values", args[0] if args else None)
                if pixel_values is not None:
                    self._step_images += int(pixel_values.shape[0])
                self._pending_forwards.append([self.marks.mark(), None, None])

        @torch.compiler.disable
        def inputs_ready_hook(module, args, kwargs):
            if module.training and self._pending_forwards:
                self._pending_forwards[-1][1] = self.marks.mark()

        @torch.compiler.disable
        def post_hook(module, args, kwargs, output):
            if module.training and self._pending_forwards:
                self._pending_forwards[-1][2] = self.marks.mark()
            return output

        self._hooks = [
            model.register_forward_pre_hook(pre_hook, with_kwargs=True, prepend=True),
            model.register_forward_pre_hook(inputs_ready_hook, with_kwargs=True),
            model.register_forward_hook(post_hook, with_kwargs=True),
        ]

    # ------------------------------------------------------------------ Trainer events

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._reset()
        self.rank, self.world_size = rank_and_world()
        self.device, self.device_type = args.device, args.device.type
        self.marks = StepMarks(self.device_type)
        self.model = model
        if model is not None:
            self.attach(model)
        if self.device_type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        precision = precision_name(args.bf16, args.fp16, args.tf32)
        self.peak_tflops, self.peak_source = device_peak_tflops(args.device, precision, self.user_peak_tflops)
        # The Trainer's settings the report names, read here from the arguments the Trainer hands its callbacks.
        self.trainer_settings = {
            "per_device_train_batch_size": args.per_device_train_batch_size,
            "gradient_accumulation_steps": args.gradient_accumulation_steps,
            "precision": precision,
            "torch_compile": bool(args.torch_compile),
            "compile_backend": args.torch_compile_backend if args.torch_compile else None,
        }

    def on_step_begin(self, args, state, control, **kwargs):
        if self._uses_fast_paths() and len(self.compute) + len(self._unread) == self.warmup_steps:
            from hf_vit_scaling.parallel.fast_paths.registry import fast_path_runs  # a DeepSpeed run's only

            self._fast_paths_before = fast_path_runs()  # the first measured step begins
        self._step_begin = self.marks.mark()
        self._step_excluded = self._paused or self._last_end is None
        self._step_previous_end = self._last_end
        self._paused = False
        self._step_images, self._pending_forwards = 0, []
        self.compile_watch.begin_step()

    def on_step_end(self, args, state, control, **kwargs):
        if self._step_begin is None:
            return
        end = self.marks.mark()
        self._unread.append(
            (
                self._step_previous_end,
                self._step_begin,
                end,
                self._pending_forwards,
                self._step_excluded,
                self._step_images,
            )
        )
        self._last_end = end
        self.compile_watch.end_step()

    def flush(self) -> None:
        """Read the marks of the steps since the last flush into the per-step lists: one host wait for the window's
        last mark (CUDA), none elsewhere. Called when the Trainer logs and when training ends."""
        if not self._unread:
            return
        self.marks.wait_for(self._unread[-1][2])
        seconds = self.marks.seconds
        for previous_end, begin, end, forwards, excluded, images in self._unread:
            self.data_wait.append(float("nan") if excluded else seconds(previous_end, begin))
            self.excluded_before.append(excluded)
            self.compute.append(seconds(begin, end))
            complete = [f for f in forwards if f[2] is not None]
            self.inputs.append(sum(seconds(start, ready or start) for start, ready, _ in complete))
            self.forward.append(sum(seconds(ready or start, stop) for start, ready, stop in complete))
            self.images.append(images)
        self._unread = []

    def pause(self) -> None:
        """Leave the time from now to the next step's start out of the report (the step that follows is not
        measured): a wait the run chose, not the data loader's (an evaluation, a save, a benchmark's turn)."""
        self._paused = True

    def on_evaluate(self, args, state, control, **kwargs):
        self.pause()

    def on_save(self, args, state, control, **kwargs):
        self.pause()

    def on_log(self, args, state, control, logs=None, **kwargs):
        """Add running figures to training logs (this callback runs first, so TensorBoard & co. receive them)."""
        if logs is None or "loss" not in logs:
            return
        self.flush()
        live = self._rate_figures()
        if live["images_per_s"] is None:
            return
        logs["throughput/images_per_s"] = round(live["images_per_s"] * self.world_size / self.sp, 2)
        if live["step_time_median"] is not None:  # None when every measured step followed a save/eval
            logs["throughput/step_time_s"] = round(live["step_time_median"], 5)
        if self.peak_tflops and self.model is not None:
            tflops = live["images_per_s"] / self.sp * self._counted_flops() / 1e12
            logs["throughput/mfu"] = round(tflops / self.peak_tflops, 5)

    def on_train_end(self, args, state, control, **kwargs):
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        self.flush()
        self.report = summarize(gather_object(self._local_figures()), self._setup())
        if state.is_world_process_zero:
            os.makedirs(args.output_dir, exist_ok=True)
            with open(os.path.join(args.output_dir, REPORT_FILENAME), "w", encoding="utf-8") as f:
                json.dump(self.report, f, indent=2)
            if self.print_table:
                logger.info("\n" + format_report(self.report))  # on its own lines after the progress bar

    def _uses_fast_paths(self) -> bool:
        return self.engine is not None and "on" in self.engine.fast_paths.values()

    def _fast_paths_ran(self) -> dict[str, int]:
        """{fast path: times it ran in the measured steps} (a path that acts when the engine is built: since then)."""
        if not self._uses_fast_paths() or self._fast_paths_before is None:
            return {}
        from hf_vit_scaling.parallel.fast_paths.registry import ran_since

        return ran_since(self._fast_paths_before)

    # ------------------------------------------------------------------ this rank's figures

    def _measured_steps(self) -> range:
        return range(self.warmup_steps, len(self.compute))

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
        """Everything this rank contributes to the report (see `summary` for the keys)."""
        rates = self._rate_figures()
        idx = self._measured_steps()
        step_times = rates.pop("step_times")
        return {
            **rates,
            "step_time_mean": _mean(step_times),
            "step_time_p90": _percentile(step_times, 90),
            "compute_mean": _mean([self.compute[i] for i in idx]),
            "data_wait_mean": _mean([self.data_wait[i] for i in idx if not self.excluded_before[i]]),
            "forward_mean": _mean([self.forward[i] for i in idx]),
            "input_mean": _mean([self.inputs[i] for i in idx]),
            # Own work before the gradient sync: data wait + input hooks + forward + backward, backward ~ 2x forward
            # (Kaplan et al. 2020, sec. 2.1: training ~ 3x forward FLOPs); the input hooks have no backward.
            "own_work": [
                (0.0 if self.excluded_before[i] else self.data_wait[i]) + self.inputs[i] + 3.0 * self.forward[i]
                for i in idx
            ][-MAX_STEPS_GATHERED:],
            "memory": _memory(self.device_type, self.device),
            "compile": self.compile_watch.figures(self.warmup_steps, self._step_seconds(), self.images),
            "device": _device_name(self.device),
            "hostname": platform.node(),
            # torchrun/accelerate export the node's rank as GROUP_RANK (NODE_RANK for some launchers): two "nodes"
            # on one host still count as two.
            "node": f"{platform.node()}#{os.environ.get('GROUP_RANK', os.environ.get('NODE_RANK', '0'))}",
        }

    def _step_seconds(self) -> list[float]:
        """Each step's wall seconds: compute, plus the data wait unless an evaluation or save came before it."""
        steps = zip(self.compute, self.data_wait, self.excluded_before)
        return [compute + (0.0 if excluded else wait) for compute, wait, excluded in steps]

    def _train_flops(self) -> int:
        """Training FLOPs per image: the ViT formula, or a CNN's counted forward x 3 (counted once)."""
        if getattr(self, "_train_flops_per_image", None) is None:
            self._train_flops_per_image = train_flops_per_image(self.model.config)
        return self._train_flops_per_image

    def _teacher_flops(self) -> int | None:
        """The teacher's forward FLOPs per image at the student's image size (counted once), None without one."""
        if self.teacher_config is None:
            return None
        if getattr(self, "_teacher_flops_per_image", None) is None:
            size = as_pair(self.model.config.image_size)
            self._teacher_flops_per_image = forward_flops_per_image(self.teacher_config, image_size=size)
        return self._teacher_flops_per_image

    def _counted_flops(self) -> int:
        """FLOPs per training image the MFU counts: the student's forward + backward and the teacher's forward."""
        return self._train_flops() + (self._teacher_flops() or 0)

    def _setup(self) -> dict:
        config = self.model.config
        engine = self.engine
        settings = self.trainer_settings
        return {
            "engine": engine.kind if engine is not None else "trainer",
            "engine_route": engine.route if engine is not None else None,
            "per_device_train_batch_size": settings["per_device_train_batch_size"],
            "gradient_accumulation_steps": settings["gradient_accumulation_steps"],
            "zero_stage": engine.zero_stage if engine is not None else None,
            "offload": engine.offload if engine is not None else {},
            "deepspeed_resolved": dict(engine.resolved) if engine is not None else {},
            "deepspeed_fast_paths": dict(engine.fast_paths) if engine is not None else {},
            "deepspeed_fast_paths_ran": self._fast_paths_ran(),
            "precision": settings["precision"],
            "image_size": as_pair(config.image_size)[0],
            "patch_size": as_pair(config.patch_size)[0] if has_patches(config) else None,
            "tokens_per_image": tokens_per_image(config),
            "num_parameters": count_parameters(self.model),
            "forward_macs_per_image": forward_macs_per_image(config),
            "train_flops_per_image": self._train_flops(),
            "teacher_forward_flops_per_image": self._teacher_flops(),
            "versions": _versions(),
            "simulated_slow_ranks": self.slow_ranks,
            "rank_batches": self.rank_batches,
            "sequence_parallel_size": self.sp,
            "warmup_steps": self.warmup_steps,
            "peak_tflops": self.peak_tflops,
            "peak_source": self.peak_source,
            "memory_kind": "allocated_peak_bytes" if self.device_type == "cuda" else "rss_peak_bytes",
            "torch_compile": settings["torch_compile"],
            "compile_backend": settings["compile_backend"],
        }


def add_throughput_callback(trainer, **kwargs) -> ThroughputCallback:
    """Attach the report to a Trainer. It goes first in the callback list so that the figures it adds to the logs
    (`on_log`) reach the reporting integrations (TensorBoard, W&B, ...) that run after it."""
    callback = ThroughputCallback(**kwargs)
    trainer.callback_handler.callbacks.insert(0, callback)
    return callback
