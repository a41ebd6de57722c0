#!/usr/bin/env python
"""Sequence parallelism: activation memory per rank and communication overhead for one large image, 1 vs N ranks.

On this project's CPU machines (1 thread per process, gloo):

    python benchmarks/sequence_parallel.py --model_preset vit-s-16 --image_size 512 --nproc 1,2 \
        --output benchmarks/results/sequence_parallel_cpu.json

On GPUs (N GPUs, NCCL; one process per GPU; ViT-B/16 at 1024 px = 4,097 tokens):

    python benchmarks/sequence_parallel.py --device cuda --model_preset vit-b-16 --image_size 1024 --nproc 1,2,4,8

Setup: one image (batch 1), fp32, random init, dropout 0, sdpa attention; each arm is a `torchrun --nproc_per_node
N` launch of this script in worker mode (N = 1: the plain model, no SP hooks). Each step is forward + backward of
the classification loss; with N > 1 the gradients are then all-reduced over the SP group (what ZeRO 0-2 do).
Method:
- activation memory: the bytes autograd saves for backward during the forward, counted with
  `torch.autograd.graph.saved_tensors_hooks`, deduplicated by storage (a tensor saved by several ops counts once),
  parameters left out (a linear layer saves its weight);
  this is the memory that sequence parallelism divides. On CUDA also `torch.cuda.max_memory_allocated` over the step
  minus the allocation before it (parameters and gradients included in neither). On CPU also the process's peak RSS.
- time: wall clock per step, median of `--steps` after `--warmup`. Communication: wall time inside the collectives,
  waiting for the other ranks included, taken by wrapping `torch.distributed`'s functions, in two parts: SP's own
  (Ulysses all-to-all, position and sequence all-gather, pixel broadcast) and the gradient all-reduce over the SP
  group (which data parallelism pays too). All are reported as ratios to the N = 1 step. On CPU also the process's
  CPU time per step (`time.process_time`), which other jobs on a shared machine do not inflate (gloo's waits may
  spin, so it includes some waiting).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- worker (one rank)


class CollectiveTimer:
    """Wrap torch.distributed collectives (deepspeed.comm dispatches to them) and add up the time spent inside."""

    NAMES = ("all_to_all_single", "all_gather", "broadcast", "all_reduce", "all_gather_into_tensor")

    def __init__(self, device_type: str):
        import torch.distributed as dist

        self.seconds, self.by_name, self.active = 0.0, {}, False
        self.device_type = device_type
        for name in self.NAMES:
            setattr(dist, name, self._wrap(name, getattr(dist, name)))

    def _sync(self):
        if self.device_type == "cuda":
            import torch

            torch.cuda.synchronize()

    def _wrap(self, name, fn):
        def timed(*args, **kwargs):
            if not self.active:
                return fn(*args, **kwargs)
            self._sync()
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            self._sync()
            seconds = time.perf_counter() - start
            self.seconds += seconds
            self.by_name[name] = self.by_name.get(name, 0.0) + seconds
            return out

        return timed


def saved_activation_bytes(step, model) -> int:
    """Run `step` (forward + backward) and return the bytes autograd saved for backward, once per storage.
    Parameters (a linear layer saves its weight) are not activations and are left out."""
    import torch

    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return sum(seen.values())


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    distributed = "WORLD_SIZE" in os.environ
    cuda = args.device == "cuda"
    if distributed:
        if cuda:
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl" if cuda else "gloo")
    world = dist.get_world_size() if distributed else 1
    rank = dist.get_rank() if distributed else 0
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    timer = CollectiveTimer(device.type)  # before deepspeed binds the functions

    from hf_vit_scaling.models.presets import build_model_from_preset, preset_config
    from hf_vit_scaling.parallel.distributed import shutdown_distributed
    from hf_vit_scaling.parallel.sequence_parallel import setup_sequence_parallel
    from hf_vit_scaling.utils import peak_rss_bytes

    sp = None
    if world > 1:
        import deepspeed

        deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
        sp = setup_sequence_parallel(world, 2)  # ZeRO-2
    torch.manual_seed(0)
    config = preset_config(args.model_preset, [str(i) for i in range(10)], image_size=args.image_size)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    model = build_model_from_preset(config).to(device).train()
    if sp is not None:
        sp.attach(model)
    generator = torch.Generator().manual_seed(1)
    pixels = torch.randn(1, 3, args.image_size, args.image_size, generator=generator).to(device)
    labels = torch.tensor([3], device=device)

    def step():
        model.zero_grad(set_to_none=True)
        model(pixel_values=pixels, labels=labels).loss.backward()
        if sp is not None:
            flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            dist.all_reduce(flat, group=sp.group)

    times, comm, grad_sync, cpu = [], [], [], []
    for i in range(args.warmup + args.steps):
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        timer.seconds, timer.by_name, timer.active = 0.0, {}, True
        start, cpu_start = time.perf_counter(), time.process_time()
        activation = saved_activation_bytes(step, model)
        if cuda:
            torch.cuda.synchronize()
        elapsed, cpu_elapsed = time.perf_counter() - start, time.process_time() - cpu_start
        timer.active = False
        if i >= args.warmup:
            times.append(elapsed)
            cpu.append(cpu_elapsed)
            grad_sync.append(timer.by_name.get("all_reduce", 0.0))
            comm.append(timer.seconds - grad_sync[-1])
    result = {
        "rank": rank,
        "saved_activation_bytes": activation,
        "cuda_peak_step_bytes": torch.cuda.max_memory_allocated() - before if cuda else None,
        "rss_peak_bytes": peak_rss_bytes(),
        "step_s_median": statistics.median(times),
        "cpu_s_median": statistics.median(cpu),
        "comm_s_median": statistics.median(comm),
        "grad_allreduce_s_median": statistics.median(grad_sync),
        "step_s": times,
    }
    gathered = [None] * world
    if distributed:
        dist.all_gather_object(gathered, result)
    else:
        gathered = [result]
    if rank == 0:
        with open(args.worker_output, "w", encoding="utf-8") as f:
            json.dump(gathered, f)
    shutdown_distributed()  # a no-op without a process group


# --------------------------------------------------------------------------- driver


def launch(args, nproc: int, out: str) -> list[dict]:
    torchrun = Path(sys.executable).parent / "torchrun"
    cmd = [
        str(torchrun),
        "--nproc_per_node",
        str(nproc),
        "--master_port",
        str(29700 + nproc),
        __file__,
        "--worker",
        "--worker_output",
        out,
        "--model_preset",
        args.model_preset,
        "--image_size",
        str(args.image_size),
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--threads",
        str(args.threads),
        "--device",
        args.device,
    ]
    if nproc == 1:
        cmd = [sys.executable, *cmd[5:]]  # no launcher: the plain model, no process group
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(args.threads),
        DS_ACCELERATOR=args.device,
        HF_HUB_OFFLINE="1",
        PYTHONWARNINGS="ignore",
    )
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{nproc} process(es) failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    with open(out, encoding="utf-8") as f:
        return json.load(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_preset", default="vit-s-16", help="A preset whose head count N divides.")
    parser.add_argument("--image_size", type=int, default=512, help="Pixels; tokens = (size / patch)^2 + 1.")
    parser.add_argument("--nproc", default="1,2", help="Sequence-parallel sizes to measure, comma-separated.")
    parser.add_argument("--steps", type=int, default=3, help="Measured steps per arm.")
    parser.add_argument("--warmup", type=int, default=1, help="Steps before measuring.")
    parser.add_argument("--threads", type=int, default=1, help="Threads per process (CPU).")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cpu (gloo) or cuda (NCCL).")
    parser.add_argument("--output", default=None, help="Write the result as JSON here.")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker_output", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import report_result

    from hf_vit_scaling.models.presets import MODEL_PRESETS

    preset = MODEL_PRESETS[args.model_preset]
    tokens = (args.image_size // preset["patch_size"]) ** 2 + 1
    arms = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in [int(x) for x in args.nproc.split(",")]:
            ranks = launch(args, n, os.path.join(tmp, f"sp{n}.json"))
            arms[n] = {
                "tokens_per_rank": -(-tokens // n),
                "saved_activation_bytes_per_rank": max(r["saved_activation_bytes"] for r in ranks),
                "cuda_peak_step_bytes_per_rank": max((r["cuda_peak_step_bytes"] or 0) for r in ranks) or None,
                "rss_peak_bytes_per_rank": max(r["rss_peak_bytes"] for r in ranks),
                "step_s_median": max(r["step_s_median"] for r in ranks),
                "cpu_s_median": max(r["cpu_s_median"] for r in ranks),
                "comm_s_median": max(r["comm_s_median"] for r in ranks),
                "grad_allreduce_s_median": max(r["grad_allreduce_s_median"] for r in ranks),
                "ranks": ranks,
            }
            print(n, {k: v for k, v in arms[n].items() if k != "ranks"}, flush=True)
    base = arms[min(arms)]
    for arm in arms.values():
        arm["activation_ratio_to_1"] = arm["saved_activation_bytes_per_rank"] / base["saved_activation_bytes_per_rank"]
        arm["step_time_ratio_to_1"] = arm["step_s_median"] / base["step_s_median"]
        arm["cpu_time_ratio_to_1"] = arm["cpu_s_median"] / base["cpu_s_median"]
        arm["sp_comm_over_nonparallel_step"] = arm["comm_s_median"] / base["step_s_median"]
        arm["grad_allreduce_over_nonparallel_step"] = arm["grad_allreduce_s_median"] / base["step_s_median"]
    result = {
        "load_average_after": os.getloadavg(),
        "setup": f"{args.model_preset} at {args.image_size} px ({tokens} tokens), batch 1, fp32, sdpa, {args.device}, "
        f"{args.threads} thread(s) per process, {args.steps} measured steps after {args.warmup}",
        "arms": {str(n): arm for n, arm in arms.items()},
    }
    report_result(result, args.output)


if __name__ == "__main__":
    main()
