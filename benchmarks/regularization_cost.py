#!/usr/bin/env python
"""Device-side cost per image of each batch regularization, ours (pure PyTorch) vs kornia.

    python benchmarks/regularization_cost.py --output benchmarks/results/regularization_cost.json

Setup: random normalised float batches as the DevicePreprocessor hands them over, (256, 3, 32, 32) and
(32, 3, 224, 224), on the CPU with one thread (`torch.set_num_threads(1)`, so figures are per core); kornia is
optional (`pip install kornia`; its rows are left out without it).
Method: each augmentation runs `--repeats` times on the same batch after one warm-up call, in rounds (every
augmentation once per round, so load from other processes touches all rows alike); the median wall time of a call
divided by the batch size is the cost per image. "per-sample ops" says whether each image draws its own
operations: kornia's RandAugment / TrivialAugment draw the ops once per batch (only magnitudes and signs per image).
Also timed: the DevicePreprocessor's crop + flip (the step before, for scale), the eval centre crop, and the EMA
update per optimizer step for the vit-tiny-cpu and vit-b-16 presets (a parameter count's worth of lerp).
"""

import argparse
import os
import platform
import statistics
import time

import torch
from _common import report_result

from hf_vit_scaling.data.device_transforms import DevicePreprocessor, EvalCenterCrop
from hf_vit_scaling.models.presets import build_model_from_preset, preset_config
from hf_vit_scaling.regularization.batch_augmenter import BatchAugmenter
from hf_vit_scaling.regularization.batch_augmenter import random_erasing as erase
from hf_vit_scaling.regularization.ema import EMACallback
from hf_vit_scaling.regularization.mixing import mix_batch
from hf_vit_scaling.regularization.rand_augment import RandAugment, parse_rand_augment

MEAN = STD = (0.5, 0.5, 0.5)


def median_ms(fn, repeats: int) -> float:
    return round_robin_ms({"fn": fn}, repeats)["fn"]


def round_robin_ms(fns: dict, repeats: int) -> dict:
    """Median ms per call of each function, timed in rounds (each function once per round, after one warm-up call
    each), so that a change in the machine's load during the run touches every row alike."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: 1000 * statistics.median(t) for name, t in times.items()}


def reference_rows(size: int, raw: torch.Tensor) -> dict:
    crop_flip, centre_crop = DevicePreprocessor(size, MEAN, STD), EvalCenterCrop(size, 0.875)
    return {
        "DevicePreprocessor crop+flip (the step before)": lambda: crop_flip(raw, True),
        "eval centre crop 0.875 (uint8)": lambda: centre_crop(raw),
    }


def ours(x: torch.Tensor) -> dict:
    rand = RandAugment(parse_rand_augment("rand-m9-mstd0.5-inc1"), fill=MEAN)
    trivial = RandAugment(parse_rand_augment("trivial"), fill=MEAN)
    unit = (x * 0.5 + 0.5).clamp(0, 1)
    deit = BatchAugmenter(
        10,
        MEAN,
        STD,
        mixup_alpha=0.8,
        cutmix_alpha=1.0,
        label_smoothing=0.1,
        rand_augment="rand-m9-mstd0.5-inc1",
        random_erasing=0.25,
    )
    return {
        "RandAugment rand-m9-mstd0.5-inc1": lambda: rand(unit),
        "TrivialAugment": lambda: trivial(unit),
        "random erasing p=0.25": lambda: erase(x, 0.25),
        "Mixup 0.8 + CutMix 1.0 (switch 0.5)": lambda: mix_batch(x, 0.8, 1.0),
        "all of DeiT's (BatchAugmenter.augment)": lambda: deit.augment(x),
    }


def kornia_rows(x: torch.Tensor) -> dict:
    try:
        import kornia.augmentation as K
        from kornia.augmentation.auto import RandAugment as KRandAugment
        from kornia.augmentation.auto import TrivialAugment as KTrivialAugment
    except ImportError:
        return {}
    unit = (x * 0.5 + 0.5).clamp(0, 1)
    labels = torch.randint(0, 10, (x.shape[0],))
    rand = K.AugmentationSequential(KRandAugment(n=2, m=27))  # kornia's m is on a 0-30 scale: 27 = timm's 9
    trivial = K.AugmentationSequential(KTrivialAugment())
    erasing = K.RandomErasing(p=0.25)
    mixup, cutmix = K.RandomMixUpV2(p=1.0), K.RandomCutMixV2(p=1.0)
    return {
        "kornia RandAugment n=2 m=27": lambda: rand(unit),
        "kornia TrivialAugment": lambda: trivial(unit),
        "kornia RandomErasing p=0.25": lambda: erasing(x),
        "kornia RandomMixUpV2": lambda: mixup(x, labels),
        "kornia RandomCutMixV2": lambda: cutmix(x, labels),
    }


PER_SAMPLE_OPS = {
    "RandAugment": True,
    "TrivialAugment": True,
    "kornia RandAugment": False,
    "kornia TrivialAugment": False,
}


def ema_update_ms(preset: str, repeats: int) -> tuple[int, float]:
    model = build_model_from_preset(preset_config(preset, [str(i) for i in range(10)]))
    ema = EMACallback(0.999)
    ema.shadow = {name: p.detach().float().clone() for name, p in model.named_parameters()}
    return sum(p.numel() for p in model.parameters()), median_ms(lambda: ema.update(model), repeats)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7, help="Timed calls per augmentation (median reported).")
    parser.add_argument("--output", default=None, help="Write the result as JSON here.")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    result = {
        "setup": {
            "cpu": platform.machine(),
            "threads": 1,
            "torch": torch.__version__,
            "repeats": args.repeats,
            "batches": {"32": 256, "224": 32},
        },
        "rows": [],
    }
    try:
        import kornia

        result["setup"]["kornia"] = kornia.__version__
    except ImportError:
        result["setup"]["kornia"] = None
    with torch.no_grad():
        for size, batch in ((32, 256), (224, 32)):
            x = torch.rand(batch, 3, size, size) * 2 - 1
            raw = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8)
            fns = {**reference_rows(size, raw), **ours(x), **kornia_rows(x)}
            for name, ms in round_robin_ms(fns, args.repeats).items():
                per_sample = next((v for k, v in PER_SAMPLE_OPS.items() if name.startswith(k)), None)
                row = {
                    "size": size,
                    "batch": batch,
                    "augmentation": name,
                    "ms_per_batch": round(ms, 3),
                    "us_per_image": round(1000 * ms / batch, 1),
                    "per_sample_ops": per_sample,
                }
                result["rows"].append(row)
                print(f"{size:4d} px  {name:48s} {row['us_per_image']:9.1f} us/image", flush=True)
    result["ema_update"] = []
    for preset in ("vit-tiny-cpu", "vit-b-16"):
        params, ms = ema_update_ms(preset, args.repeats)
        result["ema_update"].append({"preset": preset, "parameters": params, "ms_per_step": round(ms, 3)})
        print(f"EMA update {preset}: {params / 1e6:.2f} M parameters, {ms:.2f} ms per optimizer step", flush=True)
    result["setup"]["load_average_1min_at_end"] = os.getloadavg()[0]  # other processes sharing the cores
    report_result(result, args.output)


if __name__ == "__main__":
    main()
