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
# folders or a higher layer. A dotted entry (`folder.module`) would place that module apart from its folder.
LAYERS = (
    ("utils",),  # a leaf
    ("log",),  # imports nothing from the package: every module may log
    ("errors",),  # the stops and their exit codes; `exit_code_for` logs its one line
    ("models", "parallel", "losses"),
    ("data", "regularization", "throughput"),
    ("evaluation", "optim"),  # optim: the optimizer, its schedule and lrs (layer decay groups the ViT's blocks)
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


# The objects of the top layers a lower module must not take, by duck typing as much as by import: the recipe's
# parsed arguments (`arguments/`, layer 7) and the settled world (`training/`, layer 6). A module below layer 6 that
# reads them depends on their shape, which the import graph cannot see; it takes the values it needs instead.
RUN_OBJECTS = {"RecipeArguments": "args", "World": "world"}  # class -> the name recipes give it
RUN_OBJECT_LAYER = 6
# Modules that take them today, each with the reason; the test fails when one no longer does (remove it here).
KNOWN_RUN_OBJECT_TAKERS: dict[str, str] = {}


def run_object_fields(root: Path) -> dict[str, set[str]]:
    """{class: its field names} of each class of RUN_OBJECTS, read from the package's source (the annotated names of
    its class body), so a field added there is covered here too."""
    fields = {}
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.name in RUN_OBJECTS:
                names = {
                    st.target.id for st in node.body if isinstance(st, ast.AnnAssign) and hasattr(st.target, "id")
                }
                fields.setdefault(node.name, set()).update(names)
    return fields


def _annotation_names(annotation) -> set[str]:
    if annotation is None:
        return set()
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):  # a string annotation
        return set(re.findall(r"\w+", annotation.value))
    return {n.id for n in ast.walk(annotation) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(annotation) if isinstance(n, ast.Attribute)
    }


def run_object_parameters(path: Path, fields: dict[str, set[str]]) -> list[str]:
    """'function(parameter: Class)' for each parameter of a function in `path` that is one of RUN_OBJECTS: annotated
    with its class, or used as it: named as recipes name it and read for one of its fields (`args.training`,
    `world.engine`), or, under any name, read for two of its fields (`a.data`, `a.streaming`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        params = [p for p in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)
                  if p.arg not in ("self", "cls")]  # fmt: skip
        read = {}  # parameter -> the attributes read from it in the function
        for sub in ast.walk(node):
            if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name):
                read.setdefault(sub.value.id, set()).add(sub.attr)
        for param in params:
            for cls, usual_name in RUN_OBJECTS.items():
                used = read.get(param.arg, set()) & fields.get(cls, set())
                if cls in _annotation_names(param.annotation) or (param.arg == usual_name and used) or len(used) >= 2:
                    found.append(f"{getattr(node, 'name', 'lambda')}({param.arg}: {cls})")
    return sorted(set(found))


def run_object_takers(root: Path, layers=LAYERS) -> dict[str, list[str]]:
    """{module: its run-object parameters} for every module below RUN_OBJECT_LAYER that takes one."""
    fields = run_object_fields(root)
    takers = {}
    for name, path in package_modules(root).items():
        here = place(name, layers)
        if here is not None and here[0] < RUN_OBJECT_LAYER and (params := run_object_parameters(path, fields)):
            takers[name] = params
    return takers


# The Trainer's own arguments stay above the layers too: `TrainingArguments` is built by `arguments/` and handed on by
# `training/` (layer 6); below it a function takes the values it needs (a batch size, a seed, a device type, the
# DeepSpeed dict), so the data, parallel, optim, ... layers do not depend on the Trainer's argument object. Found as
# for the run's objects, by import and by use: the name `TrainingArguments` in code (an import, an annotation, an
# isinstance), a parameter named as the project names it (`training_args`), or one read for two of its fields under
# any name (`a.per_device_train_batch_size`, `a.seed`). The Trainer's callback events (`on_<event>(self, args, state,
# control, ...)`) are its own interface: the Trainer hands every callback its arguments, so those are not counted.
TRAINING_ARGUMENTS = "TrainingArguments"
TRAINING_ARGUMENTS_NAME = "training_args"
TRAINING_ARGUMENTS_LAYER = 6
# Modules that take them today, each with the reason; the test fails when one no longer does (remove it here).
KNOWN_TRAINING_ARGUMENTS_TAKERS: dict[str, str] = {
    "hf_vit_scaling.evaluation.card_facts": "model_card_facts(training) reads eleven of the Trainer's settings for "
    "the card's setup table (batch, accumulation, lr, epochs, precision, seed, ...); still to be handed values",
}


def training_arguments_fields() -> set[str]:
    """The fields and properties of transformers' TrainingArguments (`world_size`, `device`, ...)."""
    import dataclasses

    from transformers import TrainingArguments

    properties = {name for name, value in vars(TrainingArguments).items() if isinstance(value, property)}
    return {f.name for f in dataclasses.fields(TrainingArguments)} | properties


def _is_callback_event(node, params) -> bool:
    return getattr(node, "name", "").startswith("on_") and [p.arg for p in params[:3]] == ["args", "state", "control"]


def training_arguments_uses(path: Path, fields: set[str]) -> list[str]:
    """Where `path` names TrainingArguments in code ('TrainingArguments@LINE') or takes them
    ('function(parameter)')."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Name) and node.id == TRAINING_ARGUMENTS:
            found.append(f"{TRAINING_ARGUMENTS}@{node.lineno}")
        elif isinstance(node, ast.Attribute) and node.attr == TRAINING_ARGUMENTS:
            found.append(f"{TRAINING_ARGUMENTS}@{node.lineno}")
        elif isinstance(node, ast.ImportFrom) and any(a.name == TRAINING_ARGUMENTS for a in node.names):
            found.append(f"{TRAINING_ARGUMENTS}@{node.lineno}")
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        params = [p for p in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)
                  if p.arg not in ("self", "cls")]  # fmt: skip
        if _is_callback_event(node, params):
            continue
        read = {}  # parameter -> the attributes read from it in the function
        for sub in ast.walk(node):
            if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name):
                read.setdefault(sub.value.id, set()).add(sub.attr)
        for param in params:
            used = read.get(param.arg, set()) & fields
            if (TRAINING_ARGUMENTS in _annotation_names(param.annotation) or param.arg == TRAINING_ARGUMENTS_NAME
                    or len(used) >= 2):  # fmt: skip
                found.append(f"{getattr(node, 'name', 'lambda')}({param.arg})")
    return sorted(set(found))


def training_arguments_takers(root: Path, layers=LAYERS, fields: set[str] | None = None) -> dict[str, list[str]]:
    """{module: where it names or takes TrainingArguments} for every module below TRAINING_ARGUMENTS_LAYER."""
    fields = training_arguments_fields() if fields is None else fields
    takers = {}
    for name, path in package_modules(root).items():
        here = place(name, layers)
        if here is not None and here[0] < TRAINING_ARGUMENTS_LAYER and (uses := training_arguments_uses(path, fields)):
            takers[name] = uses
    return takers


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


def test_no_module_below_training_takes_the_parsed_arguments_or_the_world():
    """The layers hold for what a module takes as well as what it imports: below `training/` (layer 6) no function
    takes the recipe's parsed `args` (RecipeArguments) or its `World`, except the known ones listed with a reason."""
    takers = run_object_takers(REPO / PACKAGE)
    unknown = {module: params for module, params in takers.items() if module not in KNOWN_RUN_OBJECT_TAKERS}
    assert unknown == {}, f"below layer {RUN_OBJECT_LAYER}, taking the recipe's args/World (pass values): {unknown}"
    stale = sorted(set(KNOWN_RUN_OBJECT_TAKERS) - set(takers))
    assert stale == [], f"no longer take args/World: remove them from KNOWN_RUN_OBJECT_TAKERS: {stale}"


def test_no_module_below_training_names_or_takes_the_training_arguments():
    """Below `training/` (layer 6) no module names TrainingArguments or takes them (by their usual name or read for two
    of their fields), except the known ones listed with a reason: it takes the values it needs."""
    takers = training_arguments_takers(REPO / PACKAGE)
    unknown = {module: uses for module, uses in takers.items() if module not in KNOWN_TRAINING_ARGUMENTS_TAKERS}
    assert unknown == {}, f"below layer {TRAINING_ARGUMENTS_LAYER}, taking TrainingArguments (pass values): {unknown}"
    stale = sorted(set(KNOWN_TRAINING_ARGUMENTS_TAKERS) - set(takers))
    assert stale == [], f"no longer take TrainingArguments: remove them from KNOWN_TRAINING_ARGUMENTS_TAKERS: {stale}"


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
    """`VitTrainer` stays a thin subclass (features attach as callbacks or small modules): 275 lines at most (250
    until `ruff format` laid out its hand-aligned signature and calls one argument per line: 270, no code added)."""
    n = len((REPO / PACKAGE / "training" / "trainer.py").read_text(encoding="utf-8").splitlines())
    assert n <= 275, f"training/trainer.py has {n} lines: move a feature into its own module (docs/layout.md)"


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


def test_a_lower_module_taking_args_or_world_is_found(tmp_path):
    """Each module here takes the run's objects without importing them. Fails if the check sees only imports, or
    drops one of its rules (the annotation, the usual name, any name read for two fields)."""
    root = write_package(tmp_path / "pkg", {
        "__init__.py": "",
        "arguments/__init__.py": "",
        "arguments/parse.py": "class RecipeArguments:\n    data: object\n    training: object\n"
                              "    streaming: object\n",
        "training/__init__.py": "",
        "training/run.py": "class World:\n    engine: object\n    resume_from: str\n"
                           "def prepare(args, world):\n    return args.training, world.engine\n",
        "data/__init__.py": "",
        "data/load.py": "def load(args):\n    return args.data.name\n",  # by its usual name
        "data/stream.py": "def stream(a, n: int):\n    return a.streaming, a.training, n\n",  # two fields, any name
        "data/hook.py": "def pre_hook(module, args, kwargs):\n    return args[0]\n",  # torch's hook args: a tuple
        "evaluation/__init__.py": "",
        "evaluation/card.py": "def card(w: 'World'):\n    return w\n",  # annotated
        "regularization/__init__.py": "",
        "regularization/aug.py": "def from_arguments(cls, args):\n    return args.mixup_alpha\n",  # a group, not args
    })  # fmt: skip
    assert run_object_takers(root) == {
        "pkg.data.load": ["load(args: RecipeArguments)"],
        "pkg.data.stream": ["stream(a: RecipeArguments)"],
        "pkg.evaluation.card": ["card(w: World)"],
    }


def test_a_lower_module_taking_the_training_arguments_is_found(tmp_path):
    """Each module below layer 6 here names or takes TrainingArguments one way; the training layer and a callback
    event may. Fails if the check drops one of its rules (the name, the usual parameter name, two fields read)."""
    root = write_package(tmp_path / "pkg", {
        "__init__.py": "",
        "training/__init__.py": "",
        "training/run.py": "from transformers import TrainingArguments\n"
                           "def prepare(training_args):\n    return training_args.seed\n",  # its own layer: allowed
        "parallel/__init__.py": "",
        "parallel/engine.py": "def start(engine, training_args):\n    return engine\n",  # by its usual name
        "parallel/hetero.py": "def loader(args):\n    return args.seed, args.dataloader_num_workers\n",  # two fields
        "parallel/fine.py": "def loader(seed, args):\n    return seed, args.seed\n",  # one field: a value's name
        "data/__init__.py": "",
        "data/pipeline.py": "import transformers\n"
                            "def attach(t: transformers.TrainingArguments):\n    return t\n",  # annotated
        "throughput/__init__.py": "",
        "throughput/timing.py": "class Timing:\n"
                                "    def on_train_begin(self, args, state, control, **kwargs):\n"
                                "        return args.seed, args.output_dir\n",  # the Trainer's callback event
    })  # fmt: skip
    fields = {"seed", "dataloader_num_workers", "output_dir", "per_device_train_batch_size"}
    assert training_arguments_takers(root, fields=fields) == {
        "pkg.data.pipeline": ["TrainingArguments@2", "attach(t)"],
        "pkg.parallel.engine": ["start(training_args)"],
        "pkg.parallel.hetero": ["loader(args)"],
    }


# --------------------------------------------------------------------------- the script folders

SCRIPT_FOLDERS = ("benchmarks", "tools")


def sibling_import_graph(folder: Path) -> dict[str, set[str]]:
    """{script: the sibling scripts it imports} of a folder whose scripts import each other by name, as they run
    from it (`import figures`, `from gpu_check_items import Check`, deferred imports included); a package in it
    (table_renderers/) is one node, its modules' imports its own."""
    files = {p.stem: [p] for p in folder.glob("*.py")}
    files |= {p.name: sorted(p.glob("*.py")) for p in folder.iterdir() if (p / "__init__.py").is_file()}
    graph = {}
    for name, paths in files.items():
        found = set()
        for path in paths:
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    found |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    found.add(node.module.split(".")[0])
        graph[name] = {m for m in found if m in files and m != name}
    return graph


@pytest.mark.parametrize("folder", SCRIPT_FOLDERS)
def test_the_script_folders_have_no_import_cycle(folder):
    cycle = find_cycle(sibling_import_graph(REPO / folder))
    assert cycle is None, f"{folder}/: import cycle: " + " -> ".join(cycle)


def test_a_cycle_between_scripts_is_found(tmp_path):
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from c import g\n")
    (tmp_path / "c.py").write_text("import a\nimport os\n")
    (tmp_path / "d.py").write_text("import a\n")
    assert find_cycle(sibling_import_graph(tmp_path)) == ["a", "b", "c", "a"]


@pytest.mark.parametrize("folder", SCRIPT_FOLDERS)
def test_the_script_folders_stay_under_500_lines(folder):
    long = [f"{p.relative_to(REPO)} ({n} lines)" for p in (REPO / folder).rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES]  # fmt: skip
    assert long == [], "over 500 lines: " + ", ".join(long)
