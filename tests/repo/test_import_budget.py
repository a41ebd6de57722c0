"""What each recipe pulls in: its own `hf_vit_scaling` imports, run in a fresh interpreter, must load at most a
budget of the package's modules and lines (so a user who copies `train_vit_minimal.py` carries only what it
uses). The lazy top-level `__init__` (PEP 562) is what keeps these numbers small: an eager one loads all ~80 modules
for any single name.

Measured when the budgets were set (2026-12-03): minimal 32 modules / 3,379 lines, train_vit and pretrain_mae the
whole run-time package (81-85 / ~10,500), plan.py 30 / 3,774 and scaling_study.py 14 / 1,235 (their logic now in
planning/), prepare_shards.py 19 / 1,913."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "hf_vit_scaling"

# recipe: (modules, lines) at most. train_vit_minimal's is the issue's: 40 modules, 4,500 lines.
BUDGETS = {
    "train_vit_minimal.py": (40, 4_500),
    # The whole run-time package: every feature is a flag of the full recipe (93 modules / 11,592 lines for
    # pretrain_mae.py on 2026-12-04, with --torch_compile's two modules and the recipes' shared parts), + optim/, the
    # one room for the optimizer and its schedule (its package, build and schedules: 3 modules, 96 lines; 97 modules /
    # 12,101 lines for pretrain_mae.py on 2026-12-06); + ~400 lines when `ruff format` took over the 96 hand-aligned
    # calls that had `# fmt: skip` (one argument per line; no code added: 12,498 lines for pretrain_mae.py); + the
    # Trainer's mixin for ZeRO-1/2's weight gather in flight (parallel/weight_gathers.py: 1 module, 98 lines; 99
    # modules / 12,730 lines for pretrain_mae.py on 2026-12-07); + every route to an engine read in one place
    # (parallel/engine_routes.py: accelerate's DeepSpeed and FSDP plugins, a bare config's left-out keys: 1 module,
    # ~190 lines; 100 modules / 13,056 lines for pretrain_mae.py on 2026-12-07); + the fast paths' room, whose
    # package module the weight gathers now sit in (parallel/fast_paths/__init__.py: 1 module, 4 lines; 101 modules /
    # 13,141 lines for pretrain_mae.py on 2026-12-08).
    "train_vit.py": (101, 13_200),
    "pretrain_mae.py": (101, 13_200),
    "plan.py": (34, 4_600),  # + parallel/deepspeed_config: the bucket rule, shared, not copied (4,500 lines formatted)
    "prepare_shards.py": (22, 2_200),
    "scaling_study.py": (18, 1_500),
}


def package_imports_of(script: Path) -> list[str]:
    """The script's module-level import statements that name the package, as source lines."""
    tree = ast.parse(script.read_text(encoding="utf-8"))

    def names_package(node) -> bool:
        if isinstance(node, ast.ImportFrom):
            return (node.module or "").split(".")[0] == PACKAGE
        return isinstance(node, ast.Import) and any(a.name.split(".")[0] == PACKAGE for a in node.names)

    return [ast.unparse(node) for node in tree.body if names_package(node)]


def package_modules_loaded(import_lines: list[str]) -> dict[str, int]:
    """{module: lines} of the package's modules a fresh interpreter holds after running `import_lines`."""
    report = (
        "import json, sys\n"
        f"print(json.dumps({{n: m.__file__ for n, m in sys.modules.items() if n.split('.')[0] == {PACKAGE!r} "
        "and getattr(m, '__file__', None)}))"
    )
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", "\n".join([*import_lines, report])], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = json.loads(proc.stdout.strip().splitlines()[-1])
    return {name: len(Path(path).read_text(encoding="utf-8").splitlines()) for name, path in files.items()}


@pytest.mark.parametrize("recipe", sorted(BUDGETS))
def test_a_recipe_loads_only_its_budget_of_the_package(recipe):
    lines = package_imports_of(REPO / "recipes" / recipe)
    assert lines, f"{recipe} imports nothing from {PACKAGE}: its budget checks nothing"
    loaded = package_modules_loaded(lines)
    max_modules, max_lines = BUDGETS[recipe]
    heaviest = ", ".join(f"{name} ({n})" for name, n in sorted(loaded.items(), key=lambda kv: -kv[1])[:8])
    assert len(loaded) <= max_modules and sum(loaded.values()) <= max_lines, (
        f"{recipe} loads {len(loaded)} modules, {sum(loaded.values()):,} lines of {PACKAGE} (budget {max_modules}, "
        f"{max_lines:,}); heaviest: {heaviest}"
    )


def test_every_recipe_has_a_budget():
    scripts = {p.name for p in (REPO / "recipes").glob("*.py")}
    assert scripts == set(BUDGETS), f"recipes without an import budget: {sorted(scripts - set(BUDGETS))}"


def test_the_budget_catches_an_eager_import():
    """The measurement itself: importing the training run's module loads far more than the minimal budget."""
    loaded = package_modules_loaded([f"import {PACKAGE}.training.run"])
    assert len(loaded) > BUDGETS["train_vit_minimal.py"][0]
