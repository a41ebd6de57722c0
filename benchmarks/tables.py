#!/usr/bin/env python
"""The tables of measured figures in the pages, generated from the results files they come from.

A generated table sits between two markers in a markdown page, the first naming the table:

    <!-- table: stop_on_signal -->
    | median step, with | ... |
    <!-- /table -->

`python benchmarks/tables.py` (`make docs-figures`) rewrites every such block from its results file;
`--check` only compares and exits 1 naming each page and table that differs (tests/repo/test_figures.py runs it).
Each table's renderer below reads one results file (written by a benchmark script with its provenance: command,
commit, CPU, versions, date) and ends with a `Source:` line naming that file, so the page says where its numbers are.
A figure typed into a page instead: the same test asks every results section ("What was measured", "Results") that
holds figure-looking numbers to name a source (a results file, a benchmark script, or a paper).
"""

import argparse
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- table: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)


def read(path: str) -> dict:
    with open(REPO / path, encoding="utf-8") as f:
        return json.load(f)


def source_line(path: str, result: dict, page: Path) -> str:
    """`Source: <file>` (a link from `page`) with the commit, CPU and date the file records (older files record less;
    the command that wrote it is in the file)."""
    where = result.get("provenance", {})
    facts = [f"commit {where['commit']}" if "commit" in where else None,
             f"{where['cpu']}, {where['cores']} cores" if "cpu" in where else None,
             where.get("date")]  # fmt: skip
    said = ", ".join(fact for fact in facts if fact)
    link = os.path.relpath(REPO / path, page.parent)
    return f"Source: [{path}]({link})" + (f" ({said})." if said else ".")


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


PYTEST_SUMMARY = re.compile(r"^=* ?(\d+ passed.* in [\d.]+s.*?) ?=*$")


def timed_command(result: dict) -> str:
    """The command, where it ran, its wall time and exit status; for a test run also pytest's own summary line."""
    summary = [m.group(1) for m in map(PYTEST_SUMMARY.match, result["output_tail"]) if m]
    header = ["command", "where", "wall time", "exit status"] + (["pytest's summary"] if summary else [])
    row = [f"`{result['timed']}`", result["where"], f"{result['wall_min']:.1f} min ({result['wall_s']:.0f} s)",
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
    "test_resume_augmented.py": "8 resumed runs, every random transform on: input paths, workers, 1 and 2 processes",
    "test_conformance.py": "every engine's uninterrupted and resumed run, shared by the whole matrix",
    "test_gpu_check.py": "`make gpu-check`'s dry run on CPU: every part end to end",
    "test_gpu_path_flags.py": "torch.compile of the recipe's model by inductor",
    "test_recipe_distributed.py": "every ds_config and launcher trains, saves and reloads on 2 processes",
    "test_streaming_launched.py": "a killed rank resumes on the same rows; peak memory at 1x and 4x the data",
    "test_slurm.py": "a private Slurm cluster: the study's sbatch, and train.sbatch requeued and resumed",
    "test_sequence_parallel_launched.py": "4 processes: 2 sequence-parallel groups of 2, augmented, resumed",
    "test_regularization_launched.py": "EMA through a killed rank and resume under ZeRO-2",
    "test_reliability.py": "each ZeRO config killed and resumed with augmentation; torchrun restarts",
    "test_push_to_hub.py": "a run pushed through huggingface_hub to a local endpoint",
    "test_mae_launched.py": "MAE pretraining killed and resumed on 2 processes",
    "test_distillation_launched.py": "a teacher trained by the recipe, then students under ZeRO-2 and ZeRO-3",
    "test_interruption_launched.py": "stop signals: one process, torchrun, ZeRO-3 and FSDP2 checkpoints compared",
    "test_hetero_launched.py": "a simulated slow rank named, and per-rank batches balanced, on 2 processes",
    "test_throughput_launched.py": "the report's figures from real 2-process runs, a slow rank among them",
    "test_fsdp.py": "FSDP2 and ZeRO-3 (with offload) trained, saved, resumed and compared on 2 processes",
    "test_models_zero3.py": "every model preset partitioned by ZeRO-3 on 2 processes",
    "test_per_rank_randomness.py": "2 ranks' draws compared under each launcher",
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
                         "SLOW_BECAUSE in benchmarks/tables.py, or make the test faster.")  # fmt: skip
    ranked = sorted(per_file.items(), key=lambda item: -sum(item[1]))[:files_shown]
    listed = sum(len(times) for times in per_file.values())
    return table(
        [f"file (of the {listed} slowest)", "s", "why"],
        [[f"`{name}` ({len(times)})", f"{sum(times):.0f}", SLOW_BECAUSE[name]] for name, times in ranked],
    )


def timed_command_and_last_line(result: dict) -> str:
    """A timed command and the last line it printed (e.g. the CPU-op build's own per-op times)."""
    return f"{timed_command(result)}\n\n```\n{result['output_tail'][-1]}\n```"


# name -> (results file, renderer)
TABLES: dict[str, tuple[str, Callable[[dict], str]]] = {
    "stop_on_signal": ("benchmarks/results/stop_on_signal.json", stop_on_signal),
    "callback_overhead": ("benchmarks/results/callback_overhead.json", callback_overhead),
    "make_test": ("benchmarks/results/make_test.json", make_test),
    "make_train": ("benchmarks/results/make_train.json", make_train),
    "make_train_report": ("benchmarks/results/make_train.json", make_train_report),
    "deepspeed_ops_build": ("benchmarks/results/deepspeed_ops_build.json", timed_command_and_last_line),
}


def pages() -> list[Path]:
    """Every markdown page of the repository (not in hidden folders or the virtual environment)."""
    return sorted(p for p in REPO.rglob("*.md") if not any(part.startswith(".") for part in p.relative_to(REPO).parts))


def render(name: str, page: Path) -> str:
    """The block's body on `page`: the table, a blank line, the Source line."""
    path, renderer = TABLES[name]
    result = read(path)
    return f"{renderer(result)}\n\n{source_line(path, result, page)}\n"


def regenerated(text: str, page: Path) -> str:
    def block(match: re.Match) -> str:
        name = match.group("name")
        if name not in TABLES:
            raise SystemExit(f"error: {page.relative_to(REPO)} names table {name!r}, which benchmarks/tables.py "
                             f"does not have. Fix: one of {', '.join(sorted(TABLES))}.")  # fmt: skip
        return match.group(1) + render(name, page) + match.group(4)

    return BLOCK.sub(block, text)


def stale_tables(text: str, page: Path) -> list[str]:
    """The names of the generated blocks in `text` (the page at `page`) that differ from their results files."""
    return [match.group("name") for match in BLOCK.finditer(text)
            if match.group("name") in TABLES and match.group("body") != render(match.group("name"), page)]  # fmt: skip


# A figure: a number with a unit of time, size, speed or a ratio. A source: a results file, a benchmark script, a
# study's folder, a paper, or an explicit "Source:" line.
FIGURE = re.compile(r"\b\d[\d,]*(\.\d+)?\s?(ms|s|min|minutes|%|×|x|images/s|MiB|GiB|GB|MB|TFLOP/s)\b")
SOURCE = re.compile(r"[\w./-]+\.(json|csv)\b|benchmarks/\w+\.py|docs/studies/|arXiv|Source:", re.I)
RESULTS_HEADING = re.compile(r"^#+ .*(measured|results)", re.I)


def unsourced_sections(text: str) -> list[str]:
    """The headings of results sections ("What was measured", "Results", ...) that hold figure-looking numbers but
    name no source anywhere in the section (its subsections included)."""
    lines = text.splitlines()
    heads = [(i, len(line) - len(line.lstrip("#"))) for i, line in enumerate(lines) if line.startswith("#")]
    found = []
    for k, (start, level) in enumerate(heads):
        if not RESULTS_HEADING.match(lines[start]):
            continue
        end = next((i for i, deeper in heads[k + 1 :] if deeper <= level), len(lines))
        section = "\n".join(lines[start:end])
        if FIGURE.search(section) and not SOURCE.search(section):
            found.append(lines[start].lstrip("# "))
    return found


def problems() -> list[str]:
    """Every generated table that differs from its results file, and every results section without a source."""
    found = []
    for page in pages():
        text, where = page.read_text(encoding="utf-8"), page.relative_to(REPO)
        found += [f"{where}: table {name} differs from {TABLES[name][0]}. Fix: python benchmarks/tables.py"
                  for name in stale_tables(text, page)]  # fmt: skip
        found += [f"{where}: the section '{heading}' shows figures without a source. Fix: name the results file, "
                  "the benchmark script or the paper" for heading in unsourced_sections(text)]  # fmt: skip
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="Compare only; exit 1 naming each block that differs.")
    args = parser.parse_args()
    if args.check:
        found = problems()
        for item in found:
            print(f"error: {item}", file=sys.stderr)
        return 1 if found else 0
    for page in pages():
        text = page.read_text(encoding="utf-8")
        new = regenerated(text, page)
        if new != text:
            page.write_text(new, encoding="utf-8")
            print(f"rewrote {page.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
