"""Every recipe that trains ends with `shutdown_distributed()`, after its last `.train(...)` call.

Without it a multi-process gloo run can abort after it finished ("terminate called without an active exception",
exit -6: a gloo worker frees Python tensors while the interpreter finalizes; docs/reliability.md). The abort comes
about once in 25 runs, too rarely for a launched test to catch, so this reads the recipes' source with `ast`."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"


def called_names(node: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every call in `node`: `f(...)` gives "f", `obj.f(...)` gives "f"."""
    calls = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            func = sub.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            calls.append((sub.lineno, name))
    return calls


def missing_shutdown(source: str) -> bool:
    """True when the source calls `.train(` but no `shutdown_distributed()` after the last such call."""
    calls = called_names(ast.parse(source))
    train_lines = [line for line, name in calls if name == "train"]
    shutdown_lines = [line for line, name in calls if name == "shutdown_distributed"]
    return bool(train_lines) and not any(line > max(train_lines) for line in shutdown_lines)


def training_recipes() -> list[Path]:
    return sorted(
        p for p in RECIPES.rglob("*.py") if any(n == "train" for _, n in called_names(ast.parse(p.read_text())))
    )


def test_the_training_recipes_are_found():
    names = {p.name for p in training_recipes()}
    assert {"train_vit.py", "train_vit_minimal.py", "pretrain_mae.py"} <= names


@pytest.mark.parametrize("recipe", training_recipes(), ids=lambda p: str(p.relative_to(RECIPES)))
def test_recipe_shuts_distributed_down_after_training(recipe):
    assert not missing_shutdown(recipe.read_text()), (
        f"{recipe.name}: call hf_vit_scaling.shutdown_distributed() after training (last line of main)"
    )


@pytest.mark.parametrize(
    ("source", "missing"),
    [
        ("trainer.train()\nshutdown_distributed()\n", False),
        ("trainer.train()\n", True),
        ("shutdown_distributed()\ntrainer.train()\n", True),
        ("print('no training here')\n", False),
    ],
)
def test_the_check_tells_a_missing_call_from_a_present_one(source, missing):
    assert missing_shutdown(source) is missing


def test_no_script_tears_gloo_down_without_draining_it():
    """Launched workers and benchmarks end through `shutdown_distributed()` too: a bare `destroy_process_group()`
    leaves DeepSpeed's groups referenced and the same abort at exit possible."""
    bare = [
        str(p.relative_to(ROOT))
        for folder in ("recipes", "benchmarks", "tests/launched")
        for p in sorted((ROOT / folder).rglob("*.py"))
        if any(name == "destroy_process_group" for _, name in called_names(ast.parse(p.read_text())))
    ]
    assert bare == [], f"replace destroy_process_group() with hf_vit_scaling.shutdown_distributed() in {bare}"
