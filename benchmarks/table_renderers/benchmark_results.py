"""The renderers of the benchmark scripts' results files (benchmarks/<name>.py writes benchmarks/results/<name>.json):
speed, input paths, floors, regularization cost, compile, and `make gpu-check`'s GPU runs."""

import re

from .cells import sig, strong, table


def stop_on_signal(result: dict) -> str:
    per_run = result["median_step_ms_per_run"]
    return table(
        [
            "median step, with",
            "median step, without",
            "ratio",
            "per-run medians, with / without",
            "the all_reduce alone",
        ],
        [
            [
                f"{result['median_step_ms']['with']:.2f} ms",
                f"{result['median_step_ms']['without']:.2f} ms",
                f"{result['ratio_with_over_without']:.3f}",
                f"{min(per_run['with']):.1f}-{max(per_run['with']):.1f} / {min(per_run['without']):.1f}-"
                f"{max(per_run['without']):.1f} ms",
                f"{result['flag_all_reduce_us'] / 1000:.2f} ms",
            ]
        ],
    )


def callback_overhead(result: dict) -> str:
    step = result["median_step_s"]
    return table(
        ["median step, with", "median step, without", "ratio", "callback's own cost per step"],
        [
            [
                f"{1000 * step['with']:.2f} ms",
                f"{1000 * step['without']:.2f} ms",
                f"{result['ratio_with_over_without']:.4f}",
                f"{1e6 * result['callback_direct_cost_s_per_step']:.1f} µs "
                f"({100 * result['direct_cost_fraction_of_step']:.3f}% of a step)",
            ]
        ],
    )


def input_path(result: dict) -> str:
    slow, fast = result["per_sample"], result["fast"]
    return table(
        ["path", "images/s per core", "bytes per image (host → device)"],
        [
            ["per-sample (float32, 224 px)", f"{slow['images_per_s_per_core']:,.0f}", f"{slow['bytes_per_image']:,}"],
            ["fast (uint8, 32 px)", f"{fast['images_per_s_per_core']:,.0f}", f"{fast['bytes_per_image']:,}"],
            ["**ratio**", f"**{result['speedup_host']:.1f}×**", f"**1/{1 / result['bytes_ratio']:.0f}**"],
        ],
    )


# input_path_auto.json's data sets and versions, as the table names them. Targets: data wait >= 1.6x lower and
# end to end >= 1.15 on Br35H, for this commit.
AUTO_DATA = {"br35h_originals": "Br35H originals", "synthetic_400_640": "synthetic 400-640 px"}
AUTO_VERSIONS = {"baseline": "before ({ref})", "this": "this commit ({ref})"}
PROBE = re.compile(r"CPU time per image \w+ ([\d.]+ ms), \w+ ([\d.]+ ms)")


def input_path_auto(result: dict) -> str:
    refs = {"baseline": result["setup"]["baseline_ref"], "this": result["provenance"]["commit"]}

    def ratio(data: dict, key: str, targeted: bool) -> str:
        rounds = ", ".join(f"{r[key]:.2f}" for r in data["rounds"])
        return f"{strong(f'{data[key]:.2f}×', targeted)} ({rounds})"

    rows = []
    for key, label in AUTO_DATA.items():
        for version, name in AUTO_VERSIONS.items():
            data = result["datasets"][key][version]
            auto, slow = data["median"]["auto"], data["median"]["per_sample"]
            probe = " against ".join(PROBE.search(data["why"]).groups())
            targeted = version == "this"
            rows.append(
                [
                    label,
                    name.format(ref=refs[version]),
                    f"{', '.join(data['auto_chose'])} ({probe})",
                    f"{auto['images_per_s']:.1f} / {slow['images_per_s']:.1f}",
                    ratio(data, "end_to_end_ratio", targeted and key == "br35h_originals"),
                    f"{1000 * auto['data_wait_s']:.1f} / {1000 * slow['data_wait_s']:.1f} ms",
                    ratio(data, "data_wait_ratio", targeted and key == "br35h_originals"),
                ]
            )
    return table(
        [
            "data",
            "code",
            "auto chose (its probe, CPU time per image)",
            "images/s auto / per_sample",
            "end to end (rounds)",
            "data wait auto / per_sample",
            "data wait lower by (rounds)",
        ],
        rows,
    )


# imagenet_shaped.json's paths, as the table names them; the targets were on (b) and (c).
IMAGENET_PATHS = {
    "a_per_sample": "(a) per-sample",
    "b_host_crop": "(b) host_crop",
    "c_shards_device": "(c) shards, device path",
    "c_shards_host_slice": "(c') shards, host slice",
}


def imagenet_shaped(result: dict) -> str:
    def disk(mb_per_s: float) -> str:
        return f"{mb_per_s / 1000:.1f} GB/s" if mb_per_s >= 1000 else f"{mb_per_s:.0f} MB/s"

    return table(
        ["path", "images/s per core", "× per-sample", "bytes per image to the device", "disk read at that rate"],
        [
            [
                label,
                f"{result['images_per_s_per_core'][key]:,.0f}",
                strong(sig(result["ratio_to_per_sample"][key]), key in ("b_host_crop", "c_shards_device")),
                f"{result['bytes_per_image_host_to_device'][key]:,}",
                disk(result["disk_read_mb_per_s_needed_per_core"][key]),
            ]
            for key, label in IMAGENET_PATHS.items()
        ],
    )


def variable_size_accuracy(result: dict) -> str:
    seeds, paths = result["setup"]["seeds"], result["setup"]["input_paths"]
    runs = {(run["input_path"], run["seed"]): run for run in result["runs"]}
    return table(
        ["input path", *(f"seed {seed}" for seed in seeds), "mean", "wall time per run"],
        [
            [
                path,
                *(f"{runs[path, seed]['eval_accuracy']:.4f}" for seed in seeds),
                f"{result['mean_by_path'][path]['mean_accuracy']:.4f}",
                " / ".join(f"{runs[path, seed]['wall_s'] / 60:.1f}" for seed in seeds) + " min",
            ]
            for path in paths
        ],
    )


# synthetic_floor.json's engines, as the table names them; the target was on all but ZeRO-3.
FLOOR_ENGINES = {"plain": "plain Trainer", "zero0": "ZeRO-0", "zero2": "ZeRO-2", "zero3": "ZeRO-3 (reported)"}


def synthetic_floor(result: dict) -> str:
    median = result["median_over_rounds"]
    return table(
        ["engine", "floor step", "recipe step", "recipe / floor (step rate)", "per-round ratios"],
        [
            [
                label,
                f"{1000 * median[key]['floor_step_s']:.1f} ms",
                f"{1000 * median[key]['recipe_step_s']:.1f} ms",
                strong(f"{median[key]['ratio']:.2f}", key != "zero3"),
                ", ".join(f"{r[key]['ratio']:.2f}" for r in result["rounds"]),
            ]
            for key, label in FLOOR_ENGINES.items()
        ],
    )


def hetero_balance(result: dict) -> str:
    speed, accuracy, balanced = result["images_per_s"], result["eval_accuracy"], result["rank_batches_balanced"]
    seeds = re.search(r"seeds \[([\d, ]+)\]", result["setup"]).group(1)
    equal = " / ".join([str(sum(balanced[0]) // len(balanced[0]))] * len(balanced[0]))

    def held_out(arm: str) -> str:
        return ", ".join(f"{a:.3f}" for a in accuracy[arm]) + f" (mean {sum(accuracy[arm]) / len(accuracy[arm]):.3f})"

    return table(
        [
            "arm",
            f"images/s (mean of {len(balanced)} seeds)",
            "per-rank micro-batch",
            f"held-out accuracy (seeds {seeds})",
        ],
        [
            ["naive (equal batches)", f"{speed['naive']:.1f}", equal, held_out("naive")],
            [
                "balanced (`--balance_batches calibrate`)",
                f"{speed['balanced']:.1f}",
                ", ".join(" / ".join(map(str, b)) for b in balanced) + " (calibrated per seed)",
                held_out("balanced"),
            ],
            [
                "ideal (each rank alone, summed)",
                f"{speed['ideal']:.1f} ({speed['alone_fast']:.1f} + {speed['alone_slow']:.1f})",
                "",
                "",
            ],
        ],
    )


def sequence_parallel(result: dict) -> str:
    """One row per sequence-parallel size N, ratios to N = 1; a communication time beside its share of that step."""

    def share(arm: dict, seconds: str, ratio: str, targeted: bool = False) -> str:
        return f"{arm[seconds]:.2f} s = {strong(f'{arm[ratio]:.2f}', targeted)}"

    def row(n: str, arm: dict) -> list[str]:
        comm = (
            ["–", "–"]
            if n == "1"
            else [
                share(arm, "comm_s_median", "sp_comm_over_nonparallel_step", True),
                share(arm, "grad_allreduce_s_median", "grad_allreduce_over_nonparallel_step"),
            ]
        )
        return [
            n,
            f"{arm['tokens_per_rank']:,}",
            f"{arm['saved_activation_bytes_per_rank'] / 1e6:.1f} MB",
            strong(sig(arm["activation_ratio_to_1"]), n != "1"),
            f"{arm['cpu_s_median']:.2f} s",
            sig(arm["cpu_time_ratio_to_1"]),
            f"{arm['step_s_median']:.2f} s",
            *comm,
        ]

    return table(
        [
            "N",
            "tokens per rank",
            "saved activations per rank",
            "ratio",
            "CPU time per step (per rank)",
            "ratio",
            "wall step",
            "SP comm / N=1 step",
            "grad all-reduce / N=1 step",
        ],
        [row(n, arm) for n, arm in result["arms"].items()],
    )


# regularization_cost.json's rows by augmentation: the table's label, ours, kornia's (Mixup + CutMix: two of them).
AUGMENTATIONS = [
    ("RandAugment `rand-m9-mstd0.5-inc1`", "RandAugment rand-m9-mstd0.5-inc1", ["kornia RandAugment n=2 m=27"]),
    ("TrivialAugment", "TrivialAugment", ["kornia TrivialAugment"]),
    ("random erasing, p = 0.25", "random erasing p=0.25", ["kornia RandomErasing p=0.25"]),
    ("Mixup + CutMix", "Mixup 0.8 + CutMix 1.0 (switch 0.5)", ["kornia RandomMixUpV2", "kornia RandomCutMixV2"]),
    ("all of DeiT's, together", "all of DeiT's (BatchAugmenter.augment)", []),
    ("for scale: the existing crop + flip", "DevicePreprocessor crop+flip (the step before)", []),
]


def regularization_cost(result: dict) -> str:
    """µs per image, ours beside kornia's; a run without kornia installed (setup's `kornia` None) has no kornia
    columns and says so under the table."""
    us = {(row["size"], row["augmentation"]): row["us_per_image"] for row in result["rows"]}
    sizes = result["setup"]["batches"]
    kornia_sizes = sizes if result["setup"].get("kornia") else {}

    def kornia(size: str, names: list[str]) -> str:
        return " + ".join(f"{us[int(size), name]:,.0f}" for name in names)

    rendered = table(
        [
            "augmentation",
            *(f"ours, {size} px (batch {batch})" for size, batch in sizes.items()),
            *(f"kornia, {size} px" for size in kornia_sizes),
        ],
        [
            [
                label,
                *(f"{us[int(size), ours]:,.0f}" for size in sizes),
                *(kornia(size, theirs) for size in kornia_sizes),
            ]
            for label, ours, theirs in AUGMENTATIONS
        ],
    )
    return (
        rendered if kornia_sizes else rendered + "\n\nkornia was not installed for this run: its columns are left out."
    )


def host_path_regularization(result: dict) -> str:
    return table(
        [
            "size",
            "host images/s, all off",
            "host images/s, all on",
            "on / off",
            "device µs/image, off",
            "device µs/image, on",
        ],
        [
            [
                f"{row['size']} px",
                f"{row['host_images_per_s_off']:,.0f}",
                f"{row['host_images_per_s_on']:,.0f}",
                f"{row['host_on_over_off']:.3f}",
                sig(row["device_us_per_image_off"]),
                sig(row["device_us_per_image_on"]),
            ]
            for row in result["rows"]
        ],
    )


# compile_speed.json's engines and arms (benchmarks/synthetic_floor.py --compile), as the table names them.
COMPILE_ENGINES = {
    "plain": "plain Trainer",
    "zero0": "ZeRO-0",
    "zero2": "ZeRO-2",
    "zero3": "ZeRO-3",
    "fsdp2": "FSDP2 (2 processes)",
}
COMPILE_ARMS = {"floor": "floor", "recipe": "recipe"}


def compile_speed(result: dict) -> str:
    """Per engine and arm, eager against compiled: median steady-state steps, the compiled/eager step rate with its
    min-max over rounds, warm-up and compile seconds apart, graphs, and whether compiling stayed in the warm-up (a
    bold **no** where it did not: that arm's steady-state figures hold compile time)."""
    rows = []
    for engine, by_arm in result["median_over_rounds"].items():
        for arm, label in COMPILE_ARMS.items():
            if arm not in by_arm:
                continue
            m = by_arm[arm]
            rows.append(
                [
                    COMPILE_ENGINES[engine],
                    label,
                    f"{1000 * m['eager_step_s']:.1f} ms",
                    f"{1000 * m['compiled_step_s']:.1f} ms",
                    f"{m['speedup']:.2f}× ({m['speedup_min']:.2f}-{m['speedup_max']:.2f})",
                    f"{m['eager_warmup_s']:.1f} / {m['compiled_warmup_s']:.1f} s",
                    f"{m['compile_s']:.1f} s",
                    ", ".join(str(g) for g in m["graphs_per_rank"]),
                    str(m["recompiles_after_warmup"]),
                    "yes" if m["compiled_within_warmup"] else strong("no"),
                ]
            )
    return table(
        [
            "engine",
            "arm",
            "eager step",
            "compiled step",
            "compiled / eager step rate (min-max over rounds)",
            "warm-up eager / compiled",
            "compile",
            "graphs per rank",
            "recompiled after warm-up",
            "compiled within warm-up",
        ],
        rows,
    )


def gpu_check_merged(result: dict) -> dict:
    """A results file of several `make gpu-check` calls (`runs`) as one: each item from the last run where it was ok
    (a rerun with --only fills in what the first call could not finish), else from the first."""
    merged = {**result["runs"][0], "items": dict(result["runs"][0]["items"])}
    for run in result["runs"][1:]:
        merged["items"].update({name: r for name, r in run["items"].items() if r.get("status") == "ok"})
    return merged


def gpu_check(result: dict) -> str:
    """`make gpu-check`'s own table (benchmarks/gpu_check_report.py), its items merged over the file's runs."""
    from gpu_check_report import markdown  # benchmarks/gpu_check_report.py

    return markdown(gpu_check_merged(result)).split("\n\n", 1)[1].rstrip("\n")


def gpu_compile(result: dict) -> str:
    """Eager against compiled on the GPU: the floor (plain loop, one batch on the device) and the plain Trainer, step
    times, compiled / eager step rate, warm-up (the compile inside it) and peak memory."""
    items = gpu_check_merged(result)["items"]
    floor = items["floor"]["figures"]
    rows = [
        [
            "floor (plain loop)",
            floor["eager"]["step_s"],
            floor["compiled"]["step_s"],
            f"{floor['eager']['warmup_s']:.1f} / {floor['compiled']['warmup_s']:.1f} s",
            floor["eager"]["peak_allocated_bytes"],
            floor["compiled"]["peak_allocated_bytes"],
        ]
    ]
    eager, compiled = items["ddp-eager"].get("figures"), items["ddp-compiled"].get("figures")
    if eager and compiled:
        rows.append(
            [
                "plain Trainer",
                eager["step_time_s"],
                compiled["step_time_s"],
                "in the run's throughput.json",
                eager["memory_bytes"],
                compiled["memory_bytes"],
            ]
        )
    return table(
        [
            "run",
            "eager step",
            "compiled step",
            "compiled / eager step rate",
            "warm-up eager / compiled",
            "peak eager / compiled",
        ],
        [
            [
                name,
                f"{1000 * e:.1f} ms",
                f"{1000 * c:.1f} ms",
                f"{e / c:.2f}×",
                warm,
                f"{pe / 2**30:.2f} / {pc / 2**30:.2f} GiB",
            ]
            for name, e, c, warm, pe, pc in rows
        ],
    )


ENGINE_NAMES = {
    "plain": "plain Trainer",
    "zero0": "ZeRO-0",
    "zero1": "ZeRO-1",
    "zero2": "ZeRO-2",
    "zero3": "ZeRO-3",
    "zero2_offload": "ZeRO-2 + offload",
    "zero3_offload": "ZeRO-3 + offload",
    "fsdp2": "FSDP2 (sharded)",
    "zero2_auto": 'ZeRO-2, transformers\' "auto"',
    "zero3_auto": 'ZeRO-3, transformers\' "auto"',
    "zero1_own": "ZeRO-1, DeepSpeed's own loops",
    "zero2_own": "ZeRO-2, DeepSpeed's own loops",
    "zero3_own": "ZeRO-3, DeepSpeed's own loops",
}
COUNTED = {
    "bucket_flushes": "bucket flushes",
    "collectives": "collectives",
    "device_syncs": "device syncs",
    "host_reads": "host reads",
    "forward_hooks_run": "forward hooks run",
}


def _per_step(counts: dict) -> dict:
    """Rank 0's per-step counts, every `collective.*` summed into `collectives`."""
    collectives = sum(v for k, v in counts.items() if k.startswith("collective."))
    return {**counts, "collectives": collectives}


def engine_overhead(result: dict) -> str:
    """benchmarks/engine_overhead.py: per engine and world size, the median step time over rounds and its ratio to
    the same round's plain Trainer (DDP on 2 processes), then rank 0's counts per step of the counted run."""
    rows = []
    for key, m in result["median_over_rounds"].items():
        name, nproc = key.split("@")
        counts = _per_step(result["counts"].get(key, {"per_rank": [{}]})["per_rank"][0])
        cells = [f"{counts.get(field, 0):.0f}" if key in result["counts"] else "n/a" for field in COUNTED]
        plain = "DDP" if nproc == "2" else "plain"
        ratio = "1 (the reference)" if name == "plain" else f"{m['ratio_to_plain']:.2f}× {plain}"
        rows.append([ENGINE_NAMES[name], nproc, f"{1000 * m['step_s']:.1f} ms", ratio, *cells])
    return table(["engine", "processes", "step (median)", "step / plain", *COUNTED.values()], rows)


def engine_overhead_vit_b16(result: dict) -> str:
    """The same counts on ViT-B/16's real parameter list (224 px, batch 1, one process), "auto" against resolved."""
    rows = []
    for name, counted in result["vit_b16_counts"].items():
        counts = _per_step(counted["per_rank"][0])
        rows.append([ENGINE_NAMES[name], *(f"{counts.get(field, 0):.0f}" for field in COUNTED)])
    return table(["engine (ViT-B/16, 200 tensors)", *COUNTED.values()], rows)
