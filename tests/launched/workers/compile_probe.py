"""Runs recipes/train_vit.py in this process (same arguments) and, when its training ends, writes what dynamo
compiled on this rank to $COMPILE_PROBE_DIR/rank{R}.json, for tests/launched/test_compile.py: each compiled
frame's code (function, file) and the model parameters among its graph's inputs, and whether the object the training
loop called is compiled (`training.compile.is_compiled`).

Dynamo's compilation metrics (`torch._dynamo.utils.get_compilation_metrics`, one record per frame it compiled) name
the code each graph was traced from, so a graph of something else (a compiled loss, a helper) is not taken for the
model's forward the way a bare graph count would take it."""

import ast
import inspect
import json
import os
import runpy
import sys
from pathlib import Path

from hf_vit_scaling.training.compile import is_compiled
from hf_vit_scaling.training.trainer import VitTrainer
from tests.helpers.compile_checks import aot_autograd_graphs

RECIPE = Path(__file__).resolve().parents[3] / "recipes" / "train_vit.py"


def forward_code(model) -> tuple[set, tuple[str, int, int]]:
    """The model class's forward: the (file, first line) of each code object it runs through (its decorators'
    wrappers, then the function itself), and (file, first line, last line) of the function's source, where dynamo's
    resume functions after a graph break lie."""
    function, codes = type(model).forward, set()
    while True:
        codes.add((function.__code__.co_filename, function.__code__.co_firstlineno))
        if not hasattr(function, "__wrapped__"):
            break
        function = function.__wrapped__
    lines, first = inspect.getsourcelines(function)
    return codes, (function.__code__.co_filename, first, first + len(lines) - 1)


def compiled_frames(model) -> list[dict]:
    from torch._dynamo.utils import get_compilation_metrics

    codes, (source, first, last) = forward_code(model)
    model_files = {inspect.getsourcefile(type(module)) for module in model.modules()}
    frames = []
    for metrics in get_compilation_metrics():
        if metrics.co_name is None:
            continue
        where = (metrics.co_filename, metrics.co_firstlineno)
        resumed = metrics.co_name.startswith("torch_dynamo_resume_in_forward_at_") and source == where[0]
        resumed = resumed and first <= int(metrics.co_name.rsplit("_", 1)[1]) <= last
        shapes = ast.literal_eval(metrics.graph_node_shapes) if metrics.graph_node_shapes else {}
        frames.append({
            "function": metrics.co_name,
            "file": "/".join(Path(metrics.co_filename).parts[-3:]),
            "graph_ops": metrics.graph_op_count or 0,
            # dynamo resumes after a graph break in a function named torch_dynamo_resume_in_<function>_at_<line>, in
            # the broken function's file: one in a file of the model's modules is a break inside the model
            "resumed_in_model": metrics.co_name.startswith("torch_dynamo_resume_in_") and where[0] in model_files,
            "model_forward": where in codes or resumed,  # traced from the model class's forward
            "parameters": sorted(name for name in shapes if "_parameters_" in name),
        })  # fmt: skip
    return frames


def graph_breaks() -> dict[str, int]:
    """Dynamo's graph-break reasons in this process ({reason: times}): a `.item()`, a sync or an untraceable hook
    inside the compiled region shows up here."""
    from torch._dynamo.utils import counters

    return {str(reason): int(count) for reason, count in counters["graph_break"].items()}


def record(trainer) -> None:
    rank = int(os.environ.get("RANK", "0"))
    facts = {
        "graph_breaks": graph_breaks(),
        "loop_model": type(trainer.model_wrapped).__name__,
        "loop_model_compiled": is_compiled(trainer.model_wrapped),
        "model": type(trainer.model).__name__,
        "frames": compiled_frames(trainer.model),
        "aot_autograd_graphs": aot_autograd_graphs(),  # what the backend did, not its name
    }
    folder = Path(os.environ["COMPILE_PROBE_DIR"])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank{rank}.json").write_text(json.dumps(facts), encoding="utf-8")


original_train = VitTrainer.train


def train_and_record(self, *args, **kwargs):
    result = original_train(self, *args, **kwargs)
    record(self)  # after the training steps, before the final evaluation compiles anything more
    return result


VitTrainer.train = train_and_record
sys.argv = [str(RECIPE), *sys.argv[1:]]
runpy.run_path(str(RECIPE), run_name="__main__")
