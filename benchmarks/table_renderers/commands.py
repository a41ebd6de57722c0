"""The renderers of timed commands (benchmarks/time_command.py): `make train`, `make test` and the CPU-op build, with
the lines of their output a page shows, and the slowest test files with why each is slow."""

import re

from .cells import table

PYTEST_SUMMARY = re.compile(r"^=* ?(\d+ passed.* in [\d.]+s.*?) ?=*$")


def timed_command(result: dict) -> str:
    """The command, its wall time and exit status; for a test run also pytest's own summary line. Where it ran (a
    fresh clone, setup included) is the page's prose beside the table."""
    summary = [m.group(1) for m in map(PYTEST_SUMMARY.match, result["output_tail"]) if m]
    header = ["command", "wall time", "exit status"] + (["pytest's summary"] if summary else [])
    row = [f"`{result['timed']}`", wall_time(result), str(result["exit_code"])] + summary[-1:]
    return table(header, [row])


def wall_time(result: dict) -> str:
    return f"{result['wall_min']:.1f} min ({result['wall_s']:.0f} s)"


LAUNCHES = re.compile(r"^process launches: \d+ .*$")


def ci_run(result: dict) -> str:
    """A timed `.ci/run`: its wall time and exit status, and every pytest session's summary line (and the process
    launches the suite counted: tests/launch_count.py), in the order they were printed."""
    lines = []
    for line in result["output_tail"]:
        summary = PYTEST_SUMMARY.match(line)
        if summary or LAUNCHES.match(line):
            lines.append(summary.group(1) if summary else line)
    command = f"`{result['timed']}` at {result['provenance']['commit']}"
    row = [command, wall_time(result), str(result["exit_code"]), "<br>".join(lines)]
    return table(["command", "wall time", "exit status", "pytest's summaries"], [row])


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
    return f"{timed_command(result)}\n\n{make_test_slowest(result)}"


def make_test_slowest(result: dict) -> str:
    """The slowest test files of a timed test run and why each is slow (the README shows only the timed command)."""
    return f"The slowest test files (pytest `--durations=25`) and why:\n\n{slowest_tests(result)}"


# Why each launched test file is among the slowest: a file that enters the list needs its reason here (the table
# generation stops and names it), so every slow test is justified where the test section shows it.
SLOW_BECAUSE = {
    "test_compile.py": "--torch_compile per engine (aot_eager): the model's graphs, recompiles, eager's losses",
    "test_resume_augmented.py": "resumed runs, all augmentation on: input paths, workers, 1-2 processes (2 of 8 core)",
    "test_conformance.py": "each engine resumed, accumulated, best model, fine-tuned against its reference run",
    "test_gpu_check.py": "`make gpu-check` end to end on the CPU",
    "test_gpu_path_flags.py": "torch.compile of the recipe's model by inductor",
    "test_recipe_distributed.py": "every ds_config and launcher trains, saves and reloads on 2 processes",
    "test_streaming_launched.py": "a killed rank resumes on the same rows; peak memory at 1x and 4x the data",
    "test_slurm.py": "a private Slurm cluster: sbatch, requeue, resume",
    "test_sequence_parallel_launched.py": "4 processes: 2 groups of 2, augmented, resumed",
    "test_regularization_launched.py": "layer decay's per-group learning rates; the EMA saved beside the best model",
    "test_reliability.py": "each ZeRO config killed and resumed, augmented; torchrun restarts",
    "test_push_to_hub.py": "a run pushed through huggingface_hub to a local endpoint",
    "test_mae_launched.py": "MAE pretraining under ZeRO-3 with its k-NN accuracy, then the encoder fine-tuned",
    "test_mae_script.py": "recipes/mae/run.sh: a tiny pretraining, then its fine-tuning, 2 processes each",
    "test_distillation_launched.py": "a teacher trained by the recipe, then students under ZeRO-2 and ZeRO-3",
    "test_interruption_launched.py": "stop signals: one process, torchrun, ZeRO-3 and FSDP2 checkpoints compared",
    "test_hetero_launched.py": "a simulated slow rank named, and per-rank batches balanced, on 2 processes",
    "test_throughput_launched.py": "the report's figures from real 2-process runs, a slow rank among them",
    "test_fsdp.py": "FSDP2 and ZeRO-3 (with offload) trained, saved, resumed and compared on 2 processes",
    "test_models_zero3.py": "every model preset partitioned by ZeRO-3 on 2 processes",
    "test_prepare_launched.py": "shards prepared, then trained on by 2 processes",
    "test_recipe_commands.py": "the commands the pages print, run as printed",
    "test_studies_launched.py": "a scaling study's grid of launched runs",
    "test_bad_input.py": "each bad input through the real launcher: one error line, exit 2",
    "test_fashion_distil_script.py": "make fashion-distil's script on a tiny subset",
    "test_resume_exact.py": "runs killed and resumed, compared step by step",
    "test_weights_gathered_late.py": "3 two-process ZeRO-2 runs: the gather in flight, DeepSpeed's own, with EMA",
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
        raise SystemExit(
            f"error: {', '.join(missing)} among the slowest tests without a reason. Fix: add one to "
            "SLOW_BECAUSE in benchmarks/table_renderers/commands.py, or make the test faster."
        )
    ranked = sorted(per_file.items(), key=lambda item: -sum(item[1]))[:files_shown]
    listed = sum(len(times) for times in per_file.values())
    return table(
        [f"file (of the {listed} slowest)", "s", "why"],
        [[f"`{name}` ({len(times)})", f"{sum(times):.0f}", SLOW_BECAUSE[name]] for name, times in ranked],
    )


def timed_command_and_last_line(result: dict) -> str:
    """A timed command and the last line it printed (e.g. the CPU-op build's own per-op times)."""
    return f"{timed_command(result)}\n\n```\n{result['output_tail'][-1]}\n```"
