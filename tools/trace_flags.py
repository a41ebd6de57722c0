#!/usr/bin/env python
"""Where a flag's value goes, traced at run time: the package modules that read it, in the order they do, and
docs/layout.md's walks written from that trace.

One short run of recipes/train_vit.py in this process (the tiny preset at 16 px, one step, DeepSpeed ZeRO-0 on the
CPU, every traced flag given a value: `RUN` below) with two recorders on:

- a field read: each traced field's class (the argument group that declares it, or the object the project hands the
  value on in, `Carrier`) gets a `__getattribute__` that records the package module reading that field;
- a value passed on: `sys.setprofile` sees every call into a package function, and records it when one of its
  arguments is the value read (the same object, `is`: the float parsed from the command line, the DeepSpeed dict)
  or an object of a type derived from it (the `InputPath` `--input_path` resolves to).

A dataclass's generated `__init__` is no package function (its code is compiled from a string): a value stored in
one is followed by naming that field (`Optimization.layer_decay`). Only what ran is recorded: a module that would
read the value on another path (streaming, several processes) is not in the walk. A walk lists the package modules
in the order they read the value; a module that reads it again after another one did counts as a return.

    python tools/trace_flags.py            # rewrite the walks block in docs/layout.md
    python tools/trace_flags.py --check    # compare only; exit 1 naming each flag whose walk differs
    python tools/trace_flags.py --show input_path    # every recorded read of one flag, with its function

tests/launched/test_flag_walks.py runs `--check`.
"""

import argparse
import importlib
import importlib.util
import os
import re
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "hf_vit_scaling"
LAYOUT = REPO / "docs" / "layout.md"
BLOCK = re.compile(r"(<!-- walks: tools/trace_flags\.py -->\n)(?P<body>.*?)(<!-- /walks -->)", re.S)
FIX = "python tools/trace_flags.py"


@dataclass(frozen=True)
class Carrier:
    """Where a flag's value is followed: `fields` ("module:Class.field", read from any instance) and `types`
    ("module:Class", objects derived from the value: any package function handed one is recorded)."""

    fields: tuple[str, ...]
    types: tuple[str, ...] = ()


FLAGS = {
    "--input_path": Carrier(("hf_vit_scaling.arguments.data:DataArguments.input_path",),
                            ("hf_vit_scaling.data.input_path:InputPath",)),
    "--ds_config": Carrier(("hf_vit_scaling.arguments.engine:EngineArguments.ds_config",
                            "transformers:TrainingArguments.deepspeed",
                            "hf_vit_scaling.parallel.engine:Engine.ds_config")),
    "--mixup_alpha": Carrier(("hf_vit_scaling.arguments.regularization:RegularizationArguments.mixup_alpha",)),
    "--stop_signals": Carrier(("hf_vit_scaling.arguments.reliability:ReliabilityArguments.stop_signals",
                               "hf_vit_scaling.arguments.reliability:ReliabilityArguments.signals"),
                              ("hf_vit_scaling.training.interruption:StopOnSignal",)),
    "--learning_rate": Carrier(("transformers:TrainingArguments.learning_rate",)),
    "--layer_decay": Carrier(("hf_vit_scaling.arguments.regularization:RegularizationArguments.layer_decay",
                              "hf_vit_scaling.optim.build:Optimization.layer_decay")),
    "--torch_compile": Carrier(("transformers:TrainingArguments.torch_compile",)),
}  # fmt: skip

# The traced run: each flag of FLAGS given a value that is its own object (a fresh string, a parsed float), the
# smallest run that reaches each value's use (one optimizer step, a small evaluation, no checkpoint).
RUN = (
    "--model_preset vit-tiny-cpu --image_size 16 --per_device_train_batch_size 16 --warmup_steps 0 "
    "--report_to none --save_strategy no --disable_tqdm true --seed 0 --dataloader_num_workers 0 --peak_tflops 0.1 "
    "--max_steps 1 --max_eval_samples 16 --throughput_warmup_steps 0 "
    "--input_path device --ds_config ds_configs/zero0.json --mixup_alpha 0.8 --stop_signals SIGTERM "
    "--learning_rate 2e-3 --layer_decay 0.75 --torch_compile --torch_compile_backend eager"
).split()
ENVIRONMENT = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "DS_ACCELERATOR": "cpu",
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


@dataclass
class Read:
    module: str  # dotted, e.g. hf_vit_scaling.data.input_path
    function: str
    how: str  # "reads .field" or "is handed it"


@dataclass
class Trace:
    reads: dict[str, list[Read]] = field(default_factory=lambda: {flag: [] for flag in FLAGS})
    values: dict[str, dict[int, object]] = field(default_factory=lambda: {flag: {} for flag in FLAGS})
    types: dict[str, tuple[type, ...]] = field(default_factory=dict)

    def follow(self, flag: str, value) -> None:
        """Follow `value` by identity, unless it is an object other code holds too (None, a bool, a small int, an
        interned string): a call handed it would not tell that it came from the flag."""
        if value is None or isinstance(value, (bool, int)):
            return
        if isinstance(value, str) and value is sys.intern("".join(list(value))):
            return
        self.values[flag][id(value)] = value  # kept alive: its id stays its own

    def record(self, flag: str, frame, how: str) -> None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith(PACKAGE + ".") or module == PACKAGE:
            self.reads[flag].append(Read(module, frame.f_code.co_name, how))


def _load(spec: str):
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def watch_fields(trace: Trace) -> None:
    """Give each traced field's class a `__getattribute__` that records the package module reading the field."""
    by_class: dict[type, dict[str, str]] = {}
    for flag, carrier in FLAGS.items():
        for spec in carrier.fields:
            cls_name, _, attribute = spec.rpartition(".")
            by_class.setdefault(_load(cls_name), {})[attribute] = flag
    for cls, names in by_class.items():
        original = cls.__getattribute__

        def reading(self, name, _original=original, _names=names):
            value = _original(self, name)
            flag = _names.get(name)
            if flag is not None:
                trace.record(flag, sys._getframe(1), f"reads .{name}")
                trace.follow(flag, value)
            return value

        cls.__getattribute__ = reading


def watch_calls(trace: Trace):
    """The profile function: a call into the package handed a followed value (or an object of a derived type)."""
    for flag, carrier in FLAGS.items():
        trace.types[flag] = tuple(_load(spec) for spec in carrier.types)

    def arguments(frame) -> list:
        code = frame.f_code
        count = code.co_argcount + code.co_kwonlyargcount
        names = list(code.co_varnames[:count])
        if code.co_flags & 0x04:  # *args
            names.append(code.co_varnames[count])
            count += 1
        if code.co_flags & 0x08:  # **kwargs
            names.append(code.co_varnames[count])
        local = frame.f_locals
        found = []
        for name in names:
            value = local.get(name)
            if code.co_flags & 0x04 and name == names[-1 - bool(code.co_flags & 0x08)] and isinstance(value, tuple):
                found.extend(value)
            elif code.co_flags & 0x08 and name == names[-1] and isinstance(value, dict):
                found.extend(value.values())
            else:
                found.append(value)
        return found

    package_dir = os.path.dirname(importlib.import_module(PACKAGE).__file__) + os.sep  # the one imported

    def profile(frame, event, _arg):
        if event != "call" or not frame.f_code.co_filename.startswith(package_dir):
            return
        handed = arguments(frame)
        for flag in FLAGS:
            ids, types = trace.values[flag], trace.types[flag]
            if any(id(value) in ids or (types and isinstance(value, types)) for value in handed):
                trace.record(flag, frame, "is handed it")

    return profile


def fresh(text: str) -> str:
    """`text` as a string object of its own (not the interned literal every equal literal shares)."""
    return "".join(list(text))


def traced_run(output_dir: str) -> Trace:
    """The run of RUN (recipes/train_vit.py's `train`) with both recorders on."""
    os.environ.update(ENVIRONMENT)
    sys.path.insert(0, str(REPO))  # this checkout's package, as the recipe and the tests import it
    trace = Trace()
    argv = ["--output_dir", output_dir] + [fresh(arg) for arg in RUN]
    for flag in FLAGS:  # a string value is followed from the command line on
        value = argv[argv.index(flag) + 1] if flag in argv and argv.index(flag) + 1 < len(argv) else None
        if value is not None and not value.startswith("--"):
            trace.follow(flag, value)
    spec = importlib.util.spec_from_file_location("train_vit", REPO / "recipes" / "train_vit.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    watch_fields(trace)
    sys.setprofile(watch_calls(trace))
    try:
        recipe.train(argv)
    finally:
        sys.setprofile(None)
    return trace


def short(module: str) -> str:
    """hf_vit_scaling.data.input_path -> data/input_path.py"""
    return module.removeprefix(PACKAGE + ".").replace(".", "/") + ".py"


def steps(reads: list[Read]) -> list[tuple[str, list[str]]]:
    """Consecutive reads by one module as one step: [(module, its functions in order, each once)]."""
    out: list[tuple[str, list[str]]] = []
    for read in reads:
        if not out or out[-1][0] != read.module:
            out.append((read.module, []))
        if read.function not in out[-1][1]:
            out[-1][1].append(read.function)
    return out


def walk_row(flag: str, reads: list[Read]) -> str:
    """The flag's row: its steps, the package modules it passes through, and the returns (a module read again after
    another one read the value), with the module returned into most often."""
    walk = steps(reads)
    visits = Counter(module for module, _ in walk)
    text = " -> ".join(f"`{short(module)}` ({', '.join(f'`{f}`' for f in functions)})" for module, functions in walk)
    returns = sum(visits.values()) - len(visits)
    most, times = visits.most_common(1)[0] if visits else ("", 1)
    said = f"{returns} (`{short(most)}` {times - 1})" if times > 2 else str(returns)
    return f"| `{flag}` | {text or 'none'} | {len(visits)} | {said} |"


def render(trace: Trace) -> str:
    followed = "; ".join(
        f"`{flag}`: " + ", ".join(f"`{s.split(':')[1]}`" for s in c.fields + c.types) for flag, c in FLAGS.items()
    )
    rows = [walk_row(flag, trace.reads[flag]) for flag in FLAGS]
    return "\n".join(
        [
            "| flag | its walk: the package modules that read the value, in order (functions) | modules | returns |",
            "|---|---|---|---|",
            *rows,
            "",
            f"Traced by `{FIX}` in one run of `recipes/train_vit.py {' '.join(RUN)}`. Followed: {followed}.",
            "",
        ]
    )


def rows_by_flag(body: str) -> dict[str, str]:
    return {m.group(1): line for line in body.splitlines() if (m := re.match(r"\| `(--\w+)` \|", line))}


def differing(old_body: str, new_body: str) -> list[str]:
    """The flags whose row differs (or '(the block)' when only the rest does)."""
    old, new = rows_by_flag(old_body), rows_by_flag(new_body)
    flags = [flag for flag in dict.fromkeys([*new, *old]) if old.get(flag) != new.get(flag)]
    return flags or (["(the block's notes)"] if old_body != new_body else [])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="Compare only; exit 1 naming each flag that differs.")
    parser.add_argument(
        "--show",
        metavar="FLAG",
        choices=[f.removeprefix("--") for f in FLAGS],
        help="Also print every recorded read of this flag (its name without dashes, e.g. input_path).",
    )
    args = parser.parse_args()
    shown = f"--{args.show}" if args.show else None
    text = LAYOUT.read_text(encoding="utf-8")
    match = BLOCK.search(text)
    if match is None:
        print("error: docs/layout.md has no '<!-- walks: tools/trace_flags.py -->' block.", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as output_dir:
        trace = traced_run(output_dir)
    if shown:
        for read in trace.reads[shown]:
            print(f"{short(read.module)}:{read.function}  {read.how}")
    body = render(trace)
    if args.check:
        stale = differing(match.group("body"), body)
        traced = rows_by_flag(body)
        for flag in stale:
            print(f"traced: {traced.get(flag, body)}", file=sys.stderr)
            print(
                f"error: docs/layout.md: the walk of {flag} differs from the traced run. Fix: {FIX}", file=sys.stderr
            )
        return 1 if stale else 0
    new = text[: match.start("body")] + body + text[match.end("body") :]
    if new != text:
        LAYOUT.write_text(new, encoding="utf-8")
        print(f"rewrote {LAYOUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
