"""The synthetic floor: the Trainer's step without DeepSpeed on one batch held on the device, eager and compiled, timed
(warm-up excluded). Used by benchmarks/gpu_check.py's floor item and benchmarks/synthetic_floor.py."""

from __future__ import annotations

import time

import torch

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
    `adamw_torch_fused`, CPU and CUDA alike), zero_grad(set_to_none=True). With `compile_model`:
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
