"""The renderers of benchmarks/tables.py: each turns one results file (a dict) into the markdown table a page
shows. Named for the table; registered in `tables.TABLES` with the file it reads."""

import re


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def stop_on_signal(result: dict) -> str:
    per_run = result["median_step_ms_per_run"]
    return table(
        ["median step, with", "median step, without", "ratio", "per-run medians, with / without",
         "the all_reduce alone"],
        [[f"{result['median_step_ms']['with']:.2f} ms", f"{result['median_step_ms']['without']:.2f} ms",
          f"{result['ratio_with_over_without']:.3f}",
          f"{min(per_run['with']):.1f}-{max(per_run['with']):.1f} / {min(per_run['without']):.1f}-"
          f"{max(per_run['without']):.1f} ms", f"{result['flag_all_reduce_us'] / 1000:.2f} ms"]],
    )  # fmt: skip


def callback_overhead(result: dict) -> str:
    step = result["median_step_s"]
    return table(
        ["median step, with", "median step, without", "ratio", "callback's own cost per step"],
        [[f"{1000 * step['with']:.2f} ms", f"{1000 * step['without']:.2f} ms",
          f"{result['ratio_with_over_without']:.4f}",
          f"{1e6 * result['callback_direct_cost_s_per_step']:.1f} µs "
          f"({100 * result['direct_cost_fraction_of_step']:.3f}% of a step)"]],
    )  # fmt: skip


def strong(text: str, on: bool = True) -> str:
    """`text` in bold where `on` (the figures a target is set on)."""
    return f"**{text}**" if on else text


def sig(x: float) -> str:
    """Three significant figures; from 100 up the whole number with thousands separated."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def input_path(result: dict) -> str:
    slow, fast = result["per_sample"], result["fast"]
    return table(
        ["path", "images/s per core", "bytes per image (host → device)"],
        [["per-sample (float32, 224 px)", f"{slow['images_per_s_per_core']:,.0f}", f"{slow['bytes_per_image']:,}"],
         ["fast (uint8, 32 px)", f"{fast['images_per_s_per_core']:,.0f}", f"{fast['bytes_per_image']:,}"],
         ["**ratio**", f"**{result['speedup_host']:.1f}×**", f"**1/{1 / result['bytes_ratio']:.0f}**"]],
    )  # fmt: skip


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
            rows.append([label, name.format(ref=refs[version]), f"{', '.join(data['auto_chose'])} ({probe})",
                         f"{auto['images_per_s']:.1f} / {slow['images_per_s']:.1f}",
                         ratio(data, "end_to_end_ratio", targeted and key == "br35h_originals"),
                         f"{1000 * auto['data_wait_s']:.1f} / {1000 * slow['data_wait_s']:.1f} ms",
                         ratio(data, "data_wait_ratio", targeted and key == "br35h_originals")])  # fmt: skip
    return table(
        ["data", "code", "auto chose (its probe, CPU time per image)", "images/s auto / per_sample",
         "end to end (rounds)", "data wait auto / per_sample", "data wait lower by (rounds)"],
        rows,
    )  # fmt: skip


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
        [[label, f"{result['images_per_s_per_core'][key]:,.0f}",
          strong(sig(result["ratio_to_per_sample"][key]), key in ("b_host_crop", "c_shards_device")),
          f"{result['bytes_per_image_host_to_device'][key]:,}",
          disk(result["disk_read_mb_per_s_needed_per_core"][key])] for key, label in IMAGENET_PATHS.items()],
    )  # fmt: skip


def variable_size_accuracy(result: dict) -> str:
    seeds, paths = result["setup"]["seeds"], result["setup"]["input_paths"]
    runs = {(run["input_path"], run["seed"]): run for run in result["runs"]}
    return table(
        ["input path", *(f"seed {seed}" for seed in seeds), "mean", "wall time per run"],
        [[path, *(f"{runs[path, seed]['eval_accuracy']:.4f}" for seed in seeds),
          f"{result['mean_by_path'][path]['mean_accuracy']:.4f}",
          " / ".join(f"{runs[path, seed]['wall_s'] / 60:.1f}" for seed in seeds) + " min"] for path in paths],
    )  # fmt: skip


# synthetic_floor.json's engines, as the table names them; the target was on all but ZeRO-3.
FLOOR_ENGINES = {"plain": "plain Trainer", "zero0": "ZeRO-0", "zero2": "ZeRO-2", "zero3": "ZeRO-3 (reported)"}


def synthetic_floor(result: dict) -> str:
    median = result["median_over_rounds"]
    return table(
        ["engine", "floor step", "recipe step", "recipe / floor (step rate)", "per-round ratios"],
        [[label, f"{1000 * median[key]['floor_step_s']:.1f} ms", f"{1000 * median[key]['recipe_step_s']:.1f} ms",
          strong(f"{median[key]['ratio']:.2f}", key != "zero3"),
          ", ".join(f"{r[key]['ratio']:.2f}" for r in result["rounds"])] for key, label in FLOOR_ENGINES.items()],
    )  # fmt: skip


def hetero_balance(result: dict) -> str:
    speed, accuracy, balanced = result["images_per_s"], result["eval_accuracy"], result["rank_batches_balanced"]
    seeds = re.search(r"seeds \[([\d, ]+)\]", result["setup"]).group(1)
    equal = " / ".join([str(sum(balanced[0]) // len(balanced[0]))] * len(balanced[0]))

    def held_out(arm: str) -> str:
        return ", ".join(f"{a:.3f}" for a in accuracy[arm]) + f" (mean {sum(accuracy[arm]) / len(accuracy[arm]):.3f})"

    return table(
        ["arm", f"images/s (mean of {len(balanced)} seeds)", "per-rank micro-batch",
         f"held-out accuracy (seeds {seeds})"],
        [["naive (equal batches)", f"{speed['naive']:.1f}", equal, held_out("naive")],
         ["balanced (`--balance_batches calibrate`)", f"{speed['balanced']:.1f}",
          ", ".join(" / ".join(map(str, b)) for b in balanced) + " (calibrated per seed)", held_out("balanced")],
         ["ideal (each rank alone, summed)",
          f"{speed['ideal']:.1f} ({speed['alone_fast']:.1f} + {speed['alone_slow']:.1f})", "", ""]],
    )  # fmt: skip


def sequence_parallel(result: dict) -> str:
    """One row per sequence-parallel size N, ratios to N = 1; a communication time beside its share of that step."""

    def share(arm: dict, seconds: str, ratio: str, targeted: bool = False) -> str:
        return f"{arm[seconds]:.2f} s = {strong(f'{arm[ratio]:.2f}', targeted)}"

    def row(n: str, arm: dict) -> list[str]:
        comm = ["–", "–"] if n == "1" else [
            share(arm, "comm_s_median", "sp_comm_over_nonparallel_step", True),
            share(arm, "grad_allreduce_s_median", "grad_allreduce_over_nonparallel_step")]  # fmt: skip
        return [n, f"{arm['tokens_per_rank']:,}", f"{arm['saved_activation_bytes_per_rank'] / 1e6:.1f} MB",
                strong(sig(arm["activation_ratio_to_1"]), n != "1"), f"{arm['cpu_s_median']:.2f} s",
                sig(arm["cpu_time_ratio_to_1"]), f"{arm['step_s_median']:.2f} s", *comm]  # fmt: skip

    return table(
        ["N", "tokens per rank", "saved activations per rank", "ratio", "CPU time per step (per rank)", "ratio",
         "wall step", "SP comm / N=1 step", "grad all-reduce / N=1 step"],
        [row(n, arm) for n, arm in result["arms"].items()],
    )  # fmt: skip


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
        ["augmentation", *(f"ours, {size} px (batch {batch})" for size, batch in sizes.items()),
         *(f"kornia, {size} px" for size in kornia_sizes)],
        [[label, *(f"{us[int(size), ours]:,.0f}" for size in sizes), *(kornia(size, theirs) for size in kornia_sizes)]
         for label, ours, theirs in AUGMENTATIONS],
    )  # fmt: skip
    return (
        rendered if kornia_sizes else rendered + "\n\nkornia was not installed for this run: its columns are left out."
    )


def host_path_regularization(result: dict) -> str:
    return table(
        ["size", "host images/s, all off", "host images/s, all on", "on / off", "device µs/image, off",
         "device µs/image, on"],
        [[f"{row['size']} px", f"{row['host_images_per_s_off']:,.0f}", f"{row['host_images_per_s_on']:,.0f}",
          f"{row['host_on_over_off']:.3f}", sig(row["device_us_per_image_off"]), sig(row["device_us_per_image_on"])]
         for row in result["rows"]],
    )  # fmt: skip


ENGINES = {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero2_offload": "ZeRO-2 offload", "zero3": "ZeRO-3",
           "zero3_offload": "ZeRO-3 offload", "fsdp2": "FSDP2"}  # fmt: skip


def planner_memory_by_engine(result: dict) -> str:
    """Per engine: how many rows in fp32 and bf16, and the range of the planner's error in each."""

    def rows(engine: str, precision: str) -> list[dict]:
        return [r for r in result["rows"] if r["engine"] == engine and r["precision"] == precision]

    def error_range(found: list[dict]) -> str:
        errors = [r["peak_error"] for r in found]
        low, high = f"{min(errors):+.1%}", f"{max(errors):+.1%}"
        return low if low == high else f"{low} to {high}"

    return table(
        ["engine", "rows (fp32 + bf16)", "error, fp32", "error, bf16"],
        [[label, f"{len(rows(engine, 'fp32'))} + {len(rows(engine, 'bf16'))}",
          error_range(rows(engine, "fp32")), error_range(rows(engine, "bf16"))] for engine, label in ENGINES.items()],
    )  # fmt: skip


def planner_memory_rows(result: dict) -> str:
    """Each configuration: predicted and measured peak (MiB per rank), the error, and both at step start."""
    mib = 2**20

    def row(r: dict) -> list[str]:
        predicted, measured = r["predicted"], r["measured"]
        engine = ENGINES[r["engine"]] + (" + checkpointing" if r["gradient_checkpointing"] else "")
        return [f"`{r['name']}`", r["group"], engine, r["precision"],
                f"{r['preset']}, {r['image_size']} px, {r['batch']}", f"{predicted['peak'] / mib:,.1f}",
                f"{measured['peak'] / mib:,.1f}", f"{r['peak_error']:+.1%}",
                f"{predicted['static'] / mib:,.1f} / {measured['static'] / mib:,.1f}"]  # fmt: skip

    return table(
        ["configuration", "group", "engine", "precision", "model, image, batch", "predicted", "measured", "error",
         "predicted / measured at step start"],
        [row(r) for r in result["rows"]],
    )  # fmt: skip


def planner_study(result: dict) -> str:
    """The first run's bandwidths (10 GB/s inside a node): each GPU count's published and predicted epoch."""
    return table(
        ["GPUs", "nodes", "published epoch (s)", "predicted (s)", "compute (s)", "communication (s)", "error"],
        [[str(r["gpus"]), str(r["nodes"]), *(f"{r[key]:.2f}" for key in ("published_s", "predicted_s", "compute_s",
          "communication_s")), f"{r['error']:+.1%}"] for r in result["runs"][0]["rows"]],
    )  # fmt: skip


PYTEST_SUMMARY = re.compile(r"^=* ?(\d+ passed.* in [\d.]+s.*?) ?=*$")


def timed_command(result: dict) -> str:
    """The command, its wall time and exit status; for a test run also pytest's own summary line. Where it ran (a
    fresh clone, setup included) is the page's prose beside the table."""
    summary = [m.group(1) for m in map(PYTEST_SUMMARY.match, result["output_tail"]) if m]
    header = ["command", "wall time", "exit status"] + (["pytest's summary"] if summary else [])
    row = [f"`{result['timed']}`", f"{result['wall_min']:.1f} min ({result['wall_s']:.0f} s)",
           str(result["exit_code"])] + summary[-1:]  # fmt: skip
    return table(header, [row])


def output_block(result: dict, first: str, last: str) -> list[str]:
    """The lines of a timed command's output tail from the first line starting with `first` to the next line starting
    with `last` (both kept)."""
    lines = result["output_tail"]
    start = next(i for i, line in enumerate(lines) if line.startswith(first))
    end = next(i for i, line in enumerate(lines) if i > start and line.startswith(last))
    return lines[start : end + 1]


def make_train_report(result: dict) -> str:
    """The throughput report `make train` printed, as printed."""
    rule = "=" * 78
    return "```\n" + "\n".join([rule, *output_block(result, "Throughput report", rule)]) + "\n```"


# The eval lines README shows of `make train`'s end; "..." stands for the rest.
MAKE_TRAIN_EVAL = ("epoch", "eval_accuracy", "eval_loss", "eval_macro_f1", "eval_top5_accuracy")


def make_train(result: dict) -> str:
    """`make train`'s wall time, then the end of its output: the eval block's main lines and the Done line."""
    block = output_block(result, "***** eval metrics *****", "Done:")
    shown = [line for line in block[1:-1] if line.split("=")[0].strip() in MAKE_TRAIN_EVAL]
    end = "```\n" + "\n".join(["...", block[0], *shown, "  ...", block[-1]]) + "\n```"
    return f"{timed_command(result)}\n\nThe end of its output:\n\n{end}"


def make_test(result: dict) -> str:
    """`make test`'s wall time and pytest's summary, then the slowest test files and why each is slow."""
    slowest = slowest_tests(result)
    return f"{timed_command(result)}\n\nThe slowest test files (pytest `--durations=25`) and why:\n\n{slowest}"


# Why each launched test file is among the slowest: a file that enters the list needs its reason here (the table
# generation stops and names it), so every slow test is justified where the test section shows it.
SLOW_BECAUSE = {
    "test_compile.py": "--torch_compile under each engine (aot_eager), against eager (DDP, ZeRO-2: extended tier)",
    "test_resume_augmented.py": "resumed runs, all augmentation on: input paths, workers, 1-2 processes (3 of 8 core)",
    "test_conformance.py": "every engine's uninterrupted and resumed run (the matrix)",
    "test_gpu_check.py": "`make gpu-check` end to end on the CPU",
    "test_gpu_path_flags.py": "torch.compile of the recipe's model by inductor",
    "test_recipe_distributed.py": "every ds_config and launcher trains, saves and reloads on 2 processes",
    "test_streaming_launched.py": "a killed rank resumes on the same rows; peak memory at 1x and 4x the data",
    "test_slurm.py": "a private Slurm cluster: sbatch, requeue, resume",
    "test_sequence_parallel_launched.py": "4 processes: 2 groups of 2, augmented, resumed",
    "test_regularization_launched.py": "EMA through a killed rank and resume under ZeRO-2",
    "test_reliability.py": "each ZeRO config killed and resumed, augmented; torchrun restarts",
    "test_push_to_hub.py": "a run pushed through huggingface_hub to a local endpoint",
    "test_mae_launched.py": "MAE pretraining killed and resumed on 2 processes",
    "test_mae_script.py": "recipes/mae/run.sh: a tiny pretraining, then its fine-tuning, 2 processes each",
    "test_distillation_launched.py": "a teacher trained by the recipe, then students under ZeRO-2 and ZeRO-3",
    "test_interruption_launched.py": "stop signals: one process, torchrun, ZeRO-3 and FSDP2 checkpoints compared",
    "test_hetero_launched.py": "a simulated slow rank named, and per-rank batches balanced, on 2 processes",
    "test_throughput_launched.py": "the report's figures from real 2-process runs, a slow rank among them",
    "test_fsdp.py": "FSDP2 and ZeRO-3 (with offload) trained, saved, resumed and compared on 2 processes",
    "test_models_zero3.py": "every model preset partitioned by ZeRO-3 on 2 processes",
    "test_per_rank_randomness.py": "ranks' draws under each launcher; 4 processes in 2 sequence-parallel groups",
    "test_prepare_launched.py": "shards prepared, then trained on by 2 processes",
    "test_recipe_commands.py": "the commands the pages print, run as printed",
    "test_studies_launched.py": "a scaling study's grid of launched runs",
    "test_bad_input.py": "each bad input through the real launcher: one error line, exit 2",
    "test_fashion_distil_script.py": "make fashion-distil's script on a tiny subset",
    "test_resume_exact.py": "runs killed and resumed, compared step by step",
}
DURATION = re.compile(r"^(?P<seconds>[\d.]+)s (?P<phase>setup|call|teardown)\s+tests/\S*?(?P<file>[\w]+\.py)::")


def slowest_tests(result: dict, files_shown: int = 6) -> str:
    """The test files with the most time among pytest's slowest durations (`--durations`), with why each is slow."""
    per_file: dict[str, list[float]] = {}
    for line in result["output_tail"]:
        match = DURATION.match(line)
        if match:
            per_file.setdefault(match.group("file"), []).append(float(match.group("seconds")))
    missing = sorted(set(per_file) - set(SLOW_BECAUSE))
    if missing:
        raise SystemExit(f"error: {', '.join(missing)} among the slowest tests without a reason. Fix: add one to "
                         "SLOW_BECAUSE in benchmarks/table_renderers.py, or make the test faster.")  # fmt: skip
    ranked = sorted(per_file.items(), key=lambda item: -sum(item[1]))[:files_shown]
    listed = sum(len(times) for times in per_file.values())
    return table(
        [f"file (of the {listed} slowest)", "s", "why"],
        [[f"`{name}` ({len(times)})", f"{sum(times):.0f}", SLOW_BECAUSE[name]] for name, times in ranked],
    )


def timed_command_and_last_line(result: dict) -> str:
    """A timed command and the last line it printed (e.g. the CPU-op build's own per-op times)."""
    return f"{timed_command(result)}\n\n```\n{result['output_tail'][-1]}\n```"


# planner_published.json's groups, as the table names each run's source (the file holds the full reference).
PUBLISHED_SOURCES = {
    "dinov2": "DINOv2 paper (arXiv 2304.07193), repo",
    "eva": "EVA-CLIP paper (arXiv 2303.15389), repo",
    "nemo-a100": "NeMo ViT performance doc",
    "nemo-h100": "NeMo ViT performance doc",
    "internvit": "InternVL paper (arXiv 2312.14238), model card",
}


def published_reported(row: dict) -> str:
    reported = row["reported"]
    if "images_per_s" in reported:
        per_node = reported["images_per_s"] / row["nodes"]
        return f"{reported['images_per_s']:,} img/s ({per_node:,.0f} per node; MFU {reported['implied_mfu']:.1%})"
    said = "trained (fits)"
    return said + (f", {reported['gpu_hours']:,} GPU-hours" if "gpu_hours" in reported else "")


def planner_published(result: dict) -> str:
    """Each published run: its setup, what its source reports, the planner's memory per GPU (and whether twice the
    batch fits), its images/s per node and the ratio planner / reported."""

    def row(r: dict) -> list[str]:
        p = r["planner"]
        speed = f"{p['images_per_s_per_node']:,.0f}" if "ratio" in r else "not compared"
        ratio = f"{r['ratio']:.2f}" if "ratio" in r else "—"
        return [r["run"], r["setup"], f"{published_reported(r)}; {PUBLISHED_SOURCES[r['group']]}",
                p["engine_name"], f"{p['peak_gib']:.1f} / {p['usable_gib']:.0f}",
                f"{'yes' if p['fits'] else 'no'} ({'yes' if p['double_batch_fits'] else 'no'}; max {p['max_batch']})",
                speed, ratio]  # fmt: skip

    return table(
        ["run", "setup", "reported; source", "engine planned", "peak / usable GiB per GPU",
         "fits (2x batch; largest)", "planner img/s per node", "planner / reported"],
        [row(r) for r in result["runs"]],
    )  # fmt: skip


def planner_published_scaling(result: dict) -> str:
    """The 16-node scaling efficiency (16 nodes' throughput over 16 x one node's), published and planned."""
    names = {"nemo-a100": "NeMo ViT g/14, DGX A100", "nemo-h100": "NeMo ViT g/14, DGX H100"}
    return table(
        ["run", "published", "planner", "difference"],
        [[names[key], f"{e['published']:.1%}", f"{e['planner']:.1%}", f"{e['difference_points']:+.1f} points"]
         for key, e in result["scaling_efficiency"].items()],
    )  # fmt: skip


def planner_published_inputs(result: dict) -> str:
    """The hardware figures the commands use, each with its source."""
    return table(
        ["input", "value", "source"],
        [[name, f"{h['value']:g} {h['unit']}", h["source"]] for name, h in result["hardware"].items()],
    )


def planner_published_commands(result: dict) -> str:
    """The recipes/plan.py command behind each row (add --json for every figure, communication terms included)."""
    return table(["run", "command"], [[r["run"], f"`{r['command']}`"] for r in result["runs"]])


def planner_projection(result: dict) -> str:
    """ViT-H/14 and ViT-g/14 on 64 to 1,024 H100s: the recommended engine's step, whether it is communication-bound,
    its images/s, and the fastest option that fits."""
    return table(
        ["network", "model", "scaling", "GPUs", "per GPU", "recommended", "step s (compute + comm)", "comm-bound",
         "img/s", "fastest fitting: img/s"],
        [[r["network"], r["model"], r["scaling"], f"{r['gpus']:,}", str(r["batch"]), ENGINES_ALL[r["recommended"]],
          f"{r['step_s']:.3f} ({r['compute_s']:.3f} + {r['communication_s']:.3f})",
          "**yes**" if r["communication_bound"] else "no", f"{r['images_per_s']:,.0f}",
          f"{ENGINES_ALL[r['fastest']]}: {r['fastest_images_per_s']:,.0f}"] for r in result["projection"]],
    )  # fmt: skip


ENGINES_ALL = {**ENGINES, "hsdp": "HSDP"}


def planner_worked_example(result: dict) -> str:
    """The worked example: its recipes/plan.py command and the plan it prints."""
    example = result["worked_example"]
    return f"```\n{example['command']}\n```\n\n```\n{example['output']}\n```"


# compile_speed.json's engines and arms (benchmarks/synthetic_floor.py --compile), as the table names them.
COMPILE_ENGINES = {"plain": "plain Trainer", "zero0": "ZeRO-0", "zero2": "ZeRO-2", "zero3": "ZeRO-3",
                   "fsdp2": "FSDP2 (2 processes)"}  # fmt: skip
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
            rows.append([COMPILE_ENGINES[engine], label, f"{1000 * m['eager_step_s']:.1f} ms",
                         f"{1000 * m['compiled_step_s']:.1f} ms",
                         f"{m['speedup']:.2f}× ({m['speedup_min']:.2f}-{m['speedup_max']:.2f})",
                         f"{m['eager_warmup_s']:.1f} / {m['compiled_warmup_s']:.1f} s", f"{m['compile_s']:.1f} s",
                         ", ".join(str(g) for g in m["graphs_per_rank"]), str(m["recompiles_after_warmup"]),
                         "yes" if m["compiled_within_warmup"] else strong("no")])  # fmt: skip
    return table(
        ["engine", "arm", "eager step", "compiled step", "compiled / eager step rate (min-max over rounds)",
         "warm-up eager / compiled", "compile", "graphs per rank", "recompiled after warm-up",
         "compiled within warm-up"],
        rows,
    )  # fmt: skip


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
    rows = [["floor (plain loop)", floor["eager"]["step_s"], floor["compiled"]["step_s"],
             f"{floor['eager']['warmup_s']:.1f} / {floor['compiled']['warmup_s']:.1f} s",
             floor["eager"]["peak_allocated_bytes"], floor["compiled"]["peak_allocated_bytes"]]]  # fmt: skip
    eager, compiled = items["ddp-eager"].get("figures"), items["ddp-compiled"].get("figures")
    if eager and compiled:
        rows.append(["plain Trainer", eager["step_time_s"], compiled["step_time_s"], "in the run's throughput.json",
                     eager["memory_bytes"], compiled["memory_bytes"]])  # fmt: skip
    return table(
        ["run", "eager step", "compiled step", "compiled / eager step rate", "warm-up eager / compiled",
         "peak eager / compiled"],
        [[name, f"{1000 * e:.1f} ms", f"{1000 * c:.1f} ms", f"{e / c:.2f}×", warm,
          f"{pe / 2**30:.2f} / {pc / 2**30:.2f} GiB"] for name, e, c, warm, pe, pc in rows],
    )  # fmt: skip


# A recipe folder's results file (benchmarks/recipe_results.py): the medical recipe's test metrics, as its page
# names them.
MEDICAL_METRICS = {"roc_auc": "AUROC", "sensitivity": "sensitivity", "specificity": "specificity",
                   "balanced_accuracy": "balanced accuracy", "accuracy": "accuracy",
                   "expected_calibration_error": "expected calibration error"}  # fmt: skip


def minutes(seconds: float) -> str:
    """Seconds as the recipe pages write them: "649 s (10 min 49 s)"."""
    seconds = round(seconds)
    return f"{seconds} s ({seconds // 60} min {seconds % 60} s)"


def recipe_step_times(result: dict) -> str:
    """The recipe's command and the wall seconds of each of its steps (a step that did nothing, 0 s, left out)."""
    rows = [[name, f"{s} s"] for name, s in result["seconds"].items() if s and name != "total"]
    total = result["seconds"].get("total")
    if total is not None:
        rows.append(["total", minutes(total)])
    return f"`{result['run_command']}` (config `{result['config_file']}`):\n\n" + table(["step", "time"], rows)


def recipe_top1(result: dict) -> str:
    """A classification recipe's run: its command, epochs, top-1 on the evaluation split (bold), the EMA weights'
    top-1 where the run kept an EMA, the final training loss and the training time."""
    metrics, ema = result["metrics"], result["metrics"].get("eval_ema_accuracy")
    row = [f"`{result['run_command']}`", f"{metrics['epoch']:.0f}", strong(f"{metrics['eval_accuracy']:.4f}"),
           "n/a" if ema is None else f"{ema:.4f}", f"{metrics['train_loss']:.4f}",
           minutes(result["seconds"]["train"])]  # fmt: skip
    return table(["run", "epochs", "top-1", "EMA top-1", "train loss", "train time"], [row])


def mae_two_steps(result: dict) -> str:
    """recipes/mae/run.sh's two steps: the pretraining's reconstruction loss and k-NN accuracy (labels unused), the
    fine-tune's top-1 (bold) and EMA top-1, each step's final training loss and its wall time in the script."""
    metrics, seconds = result["metrics"], result["seconds"]
    pre, tune = metrics["pretraining"], metrics["fine-tuning"]
    top1, ema = strong(f"{tune['eval_accuracy']:.4f}"), tune.get("eval_ema_accuracy")
    rows = [["pretraining (labels unused)", f"{pre['epoch']:.1f}",
             f"reconstruction loss {pre['eval_loss']:.3f}, k-NN accuracy {pre['eval_knn_accuracy']:.3f}",
             f"{pre['train_loss']:.4f}", minutes(seconds["pretraining"])],
            ["fine-tuning", f"{tune['epoch']:.0f}", f"top-1 {top1}" + ("" if ema is None else f" (EMA {ema:.4f})"),
             f"{tune['train_loss']:.4f}", minutes(seconds["fine-tuning"])]]  # fmt: skip
    lead, total = f"`{result['run_command']}`:\n\n", f"\n\nBoth steps: {minutes(seconds['total'])}."
    return lead + table(["step", "epochs", "evaluation", "train loss", "time"], rows) + total


RULES = {"youden": "Youden's J"}


def medical_test_metrics(result: dict) -> str:
    """Test metrics at the threshold chosen on validation, each with its bootstrap interval (AUROC in bold: the
    figure the recipe's target is set on)."""
    metrics = result["metrics"]
    test, choice = metrics["test"], metrics["threshold_choice"]
    rule = RULES.get(choice["rule"], choice["rule"])
    lead = (f"Test split ({metrics['test_images']} images, {metrics['test_groups']} duplicate groups), threshold "
            f"{test['threshold']:.3f} chosen on validation by {rule}:\n\n")  # fmt: skip
    rows = [[label, strong(f"{test[key]['value']:.3f}", key == "roc_auc"),
             f"{test[key]['ci_low']:.3f} - {test[key]['ci_high']:.3f}"]
            for key, label in MEDICAL_METRICS.items()]  # fmt: skip
    argmax = metrics["test_at_argmax"]
    tail = (f"\n\nConfusion matrix at that threshold (rows true no/yes): {test['confusion_matrix']}; at argmax, "
            f"sensitivity {argmax['sensitivity']:.3f}, specificity {argmax['specificity']:.3f}.")  # fmt: skip
    return lead + table(["metric", "value", "95% CI"], rows) + tail
