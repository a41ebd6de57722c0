"""A recipe folder's run as a results file beside its README: the metrics the run wrote, the wall seconds of each of
its steps, the config it ran with, and the provenance every results file carries (commit, CPU, cores, versions,
date), so the folder's tables are generated from what ran (benchmarks/tables.py), not typed.

The recipe scripts call it at their end when `RESULTS` names the file, e.g.

    RESULTS=recipes/medical_brain_mri/results.json make medical

(recipes/medical_brain_mri/run.sh). By hand:

    python benchmarks/recipe_results.py --run_command "make medical" \
        --metrics outputs/vit-tiny-br35h/medical_results.json --config recipes/medical_brain_mri/config_vit_tiny.yaml \
        --seconds prepare=26 train=335 evaluate=14 --output recipes/medical_brain_mri/results.json
"""

from __future__ import annotations

import argparse
import json
import sys

import yaml
from _common import report_result  # benchmarks/_common.py (scripts run as benchmarks/<name>.py)


def step_seconds(pairs: list[str]) -> dict[str, int]:
    """`name=seconds` pairs as {name: seconds}, in the order given; a pair without a whole number of seconds is
    refused (the recipe script passes its shell's $SECONDS differences)."""
    seconds = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        if not name or not value.isdigit():
            raise SystemExit(f"error: --seconds {pair!r} is not name=seconds. Fix: e.g. --seconds train=335")
        seconds[name] = int(value)
    return seconds


def read_json(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_yaml(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def read_named(values: list[str], reader) -> dict:
    """One file: its content; `name=file` pairs, for a run of several models (teacher=... student=...): {name:
    content}."""
    if len(values) == 1 and "=" not in values[0]:
        return reader(values[0])
    return {name: reader(path) for name, _, path in (value.partition("=") for value in values)}


def read_inputs(metrics: list[str], configs: list[str]) -> tuple[dict, dict]:
    """The run's metrics (JSON) and configs (YAML, as train_vit.py reads them); a missing or unreadable file is one
    error line naming it, before anything is written."""
    try:
        return read_named(metrics, read_json), read_named(configs, read_yaml)
    except (OSError, ValueError, yaml.YAMLError) as err:
        problem = f"error: cannot read the run's files ({err}). Fix: run the recipe to its end first."
        raise SystemExit(problem) from None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run_command", required=True, help="The command that ran the recipe, as a user types it.")
    parser.add_argument(
        "--metrics",
        required=True,
        nargs="+",
        help="The JSON file of metrics the run wrote, or name=file pairs (teacher=... student=...).",
    )
    parser.add_argument("--config", required=True, nargs="+", help="The config file(s) the run trained with (YAML).")
    parser.add_argument("--seconds", nargs="+", default=[], help="Wall seconds of each step: name=seconds ...")
    parser.add_argument("--output", required=True, help="The results file to write (beside the recipe's README).")
    args = parser.parse_args(argv)
    seconds = step_seconds(args.seconds)
    metrics, config = read_inputs(args.metrics, args.config)
    result = {
        "run_command": args.run_command,
        "config_file": " ".join(args.config),
        "config": config,
        "seconds": seconds,
        "metrics": metrics,
    }
    report_result(result, args.output)
    print(f"Wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
