"""The package's layout rules (docs/layout.md), read from the source with `ast`, so deferred imports (inside
functions) count as much as module-level ones:

- no import cycle between modules;
- the layers: a module imports only its own folder and the layers below its own (`LAYERS`, the table in
  docs/layout.md), so run-time code never imports `arguments/` (validation runs once, at parse time) and nothing in
  the training core imports `medical/` or `planning/`;
- no top-level module besides errors, log, utils and __init__;
- no module over 500 lines, except those docs/layout.md names with the reason.

Each rule is also run on a small package made in a temporary folder that breaks it, so a checker that finds nothing
fails here instead of passing in silence."""

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "hf_vit_scaling"
# Bottom to top (docs/layout.md): a module may import its own folder and any lower layer, never its own layer's other
# folders or a higher layer. A dotted entry (`parallel.distributed`) places that module apart from its folder.
LAYERS = (
    ("errors", "utils"),  # leaves
    ("parallel.distributed",),  # rank helpers: the logger asks them who is the main process
    ("log",),
    ("models", "parallel", "losses"),
    ("data", "regularization", "throughput"),
    ("evaluation",),
    ("training",),
    ("arguments", "pretraining"),  # arguments: names, defaults and validators of the run-time folders below
    ("medical", "planning"),  # one recipe's own code, and the planner; nothing below imports them
)
TOP_LEVEL_MODULES = {"__init__", "errors", "log", "utils"}
MAX_LINES = 500


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules(root: Path) -> dict[str, Path]:
    """{dotted name: file} of every module of the package at `root`, data files such as metric_modules/ left out
    (they are loaded by path, not imported)."""
    return {module_name(p, root): p for p in root.rglob("*.py") if (p.parent / "__init__.py").exists()}


def imported_modules(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The package's modules that `path` imports anywhere in its body (module level or deferred)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for (
                alias
            ) in node.names:  # `from pkg import module` imports the module; `from module import name` the module
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {m for m in found if m in modules and m != name}


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = package_modules(root)
    return {name: imported_modules(path, name, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (depth-first search with colours)."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def place(name: str, layers=LAYERS) -> tuple[int, str] | None:
    """(layer, unit) of a module: its own dotted entry if `layers` has one, else its folder's (top-level modules are
    their own unit); None for the package's `__init__`, which re-exports the public names of every layer."""
    relative = name.split(".")[1:]
    if not relative:
        return None
    for unit in (".".join(relative[:2]), relative[0]):
        for level, units in enumerate(layers):
            if unit in units:
                return level, unit
    raise AssertionError(f"{name} is in no layer: add its folder to LAYERS and to docs/layout.md")


def layering_violations(graph: dict[str, set[str]], layers=LAYERS) -> list[str]:
    """'module -> module' for every import of a higher layer or of another unit of the same layer."""
    found = []
    for module, deps in graph.items():
        here = place(module, layers)
        for dep in deps:
            there = place(dep, layers)
            if here is None or there is None or there[1] == here[1]:
                continue
            if there[0] >= here[0]:
                found.append(f"{module} -> {dep}")
    return sorted(found)


def write_package(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


# --------------------------------------------------------------------------- the rules on the real package


def test_no_import_cycle_deferred_imports_included():
    cycle = find_cycle(import_graph(REPO / PACKAGE))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_import_against_the_layers_deferred_imports_included():
    violations = layering_violations(import_graph(REPO / PACKAGE))
    assert violations == [], "imports against the layers of docs/layout.md: " + "; ".join(violations)


def test_the_layers_of_the_test_are_the_layers_of_the_docs():
    layout = (REPO / "docs" / "layout.md").read_text(encoding="utf-8")
    for level, units in enumerate(LAYERS):
        row = f"| {level} | " + ", ".join(f"`{unit}`" for unit in units) + " |"
        assert row in layout, f"docs/layout.md's layer table lacks the row {row!r}"


def test_only_errors_log_utils_and_init_at_the_top_level():
    top = {p.stem for p in (REPO / PACKAGE).glob("*.py")}
    assert top == TOP_LEVEL_MODULES, (
        f"top-level modules besides errors, log, utils, __init__: {sorted(top - TOP_LEVEL_MODULES)}"
    )


def test_modules_stay_under_500_lines_or_layout_says_why():
    layout = (REPO / "docs" / "layout.md").read_text(encoding="utf-8")
    long = {str(p.relative_to(REPO)): len(p.read_text(encoding="utf-8").splitlines())
            for p in (REPO / PACKAGE).rglob("*.py")}  # fmt: skip
    unexplained = [
        f"{path} ({n} lines)" for path, n in long.items() if n > MAX_LINES and Path(path).name not in layout
    ]
    assert unexplained == [], "over 500 lines with no reason in docs/layout.md: " + ", ".join(unexplained)


def test_the_trainer_subclass_stays_thin():
    """`VitTrainer` stays a thin subclass (features attach as callbacks or small modules): 250 lines at most."""
    n = len((REPO / PACKAGE / "training" / "trainer.py").read_text(encoding="utf-8").splitlines())
    assert n <= 250, f"training/trainer.py has {n} lines: move a feature into its own module (docs/layout.md)"


def test_recipes_import_the_package_not_the_other_way_round():
    for path in (REPO / PACKAGE).rglob("*.py"):
        assert not re.search(r"^\s*(from|import) recipes\b", path.read_text(encoding="utf-8"), re.M), path


# --------------------------------------------------------------------------- the checkers catch a broken package


def test_a_deferred_import_cycle_is_found(tmp_path):
    root = write_package(tmp_path / "pkg", {
        "__init__.py": "",
        "data/__init__.py": "",
        "data/a.py": "from pkg.data.b import f\n",
        "data/b.py": "def f():\n    from pkg.data import c\n",
        "data/c.py": "from .a import f\n",
    })  # fmt: skip
    assert find_cycle(import_graph(root)) == ["pkg.data.a", "pkg.data.b", "pkg.data.c", "pkg.data.a"]


def test_a_deferred_import_of_a_higher_layer_is_found(tmp_path):
    root = write_package(tmp_path / "pkg", {
        "__init__.py": "",
        "medical/__init__.py": "",
        "medical/card.py": "",
        "arguments/__init__.py": "",
        "arguments/checks.py": "",
        "data/__init__.py": "",
        "data/load.py": "",
        "training/__init__.py": "",
        "training/run.py": "from pkg.data import load\ndef finish():\n    from ..medical import card\n"
                           "    from pkg.arguments.checks import x\n",
        "regularization/__init__.py": "",
        "regularization/ema.py": "from pkg.data import load\n",  # the same layer, another folder
    })  # fmt: skip
    assert layering_violations(import_graph(root)) == [
        "pkg.regularization.ema -> pkg.data.load",
        "pkg.training.run -> pkg.arguments.checks",
        "pkg.training.run -> pkg.medical.card",
    ]


@pytest.mark.parametrize("source", ["from pkg.training import run\n", "import pkg.training.run\n"])
def test_both_import_forms_make_an_edge(tmp_path, source):
    root = write_package(tmp_path / "pkg", {"__init__.py": "", "training/__init__.py": "", "training/run.py": "",
                                            "other.py": source})  # fmt: skip
    assert import_graph(root)["pkg.other"] == {"pkg.training.run"}
