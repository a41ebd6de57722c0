"""No measured figure and no version claim in the code's comments and docstrings: there no check reads them and
nothing reruns them, so they go stale. They live in the pages under the figure check (benchmarks/figures.py), and the
code names the page ("measured: benchmarks/README.md, 'Engine overhead'").

Read: every comment (tokenize) and every module, class and function docstring (ast) of hf_vit_scaling/, recipes/,
benchmarks/ and tests/helpers/. Strings that are values (help texts, messages) are not read. Left out:
- the figure check's own modules (benchmarks/figure*.py, tables.py, table_renderers/): they define how a page
  writes a figure, so their numbers are examples of page text;
- the tests themselves: a threshold's reason sits beside the assertion that checks it on every run.
A benchmark script's docstring may say what it measures and how long it is sized to run; what it measured is a page's.

A figure is a number (or a range, "6-9 s") with a unit of time (`ms`, `us`, `µs`, `s`, `sec`, `seconds`, `min`,
`minutes`, ` h`, `hours`), a rate (`img/s`, `images/s`), a size (`KB`, `KiB`, `MB`, `MiB`, `GB`, `GiB`, `TB`), a
percentage or a ratio (`2.6x`, `2.6×`; "2 x 3" is a product). A version claim is a package's name followed by a
version ("accelerate 1.15", "torch before 2.13", "DeepSpeed 0.19's"). Each figure must be one of:
- arithmetic: its line shows the sum ("16 x 1e9 / 8 = 2.0 GB"): the line has an `=` (not `>=`, `<=`, `==`) and
  does not say "measured";
- cited: its line or its paragraph (a docstring's block between blank lines, a run of comment lines) names an outside
  source: a datasheet, spec, whitepaper, paper, arXiv, "et al." or a URL;
- allowed: listed below for its module with the reason it is no measurement (a setting, a default, an upstream
  constant, a target, an example). An entry that no longer matches a figure in its module is itself reported.
A version claim is never allowed: what a version of a package does goes to the page that depends on it.
"""

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIGURE_CHECK = ("benchmarks/figure", "benchmarks/tables.py", "benchmarks/table_renderers/")

NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
UNIT = (r"(?:\s?(?:ms|us|µs|μs|s|sec|seconds?|min|minutes?|hours?|img/s|images/s|KB|KiB|MB|MiB|GB|GiB|TB)(?![\w/])"
        r"|\s(?:h)(?![\w/])|\s?%|[x×](?![\w-]))")  # fmt: skip
# Not part of a longer token: v1.2, ViT-B/16, 3e-5, a commit's hash.
FIGURE = re.compile(rf"(?<![\w.\-−+/])[-−+]?(?:{NUMBER})(?:\s?(?:-|–|to)\s?(?:{NUMBER}))?{UNIT}")
PACKAGES = r"torch|pytorch|transformers|accelerate|deepspeed|datasets|timm|numpy|python|pyarrow|pillow|safetensors"
VERSION = re.compile(rf"\b(?:{PACKAGES})\b(?:\s+(?:before|after|since|from|up to|>=|<=|<|>))?\s+v?\d+\.\d+", re.I)
EQUATION = re.compile(r"(?<![<>=!])=(?!=)")  # not >=, <=, ==, !=
CITED = re.compile(r"datasheet|\bspecs?\b|spec page|whitepaper|\bpaper\b|arXiv|et al\.|https?://", re.I)

BACKWARD_RULE = "backward ~ 2x forward: the estimate the straggler figures use (Kaplan et al. 2020), not a measurement"
TORCH_JOIN = "torch's DataLoader joins each worker with a 5 s timeout (_utils.MP_STATUS_CHECK_INTERVAL): a constant"
# module -> figure (exactly as written) -> why it is no measurement. An entry passes every occurrence in its module.
ALLOWED: dict[str, dict[str, str]] = {
    "benchmarks/gpu_check.py": {
        "9 minutes": "the check's time budget, which it enforces: a setting",
        "5%": "the data-wait target the check reports against",
    },
    "benchmarks/gpu_check_settings.py": {"9 minutes": "the check's time budget, which it enforces: a setting"},
    "benchmarks/gpu_vit_b16.py": {
        "8 minutes": "the time the script is sized to: a target",
        "50%": "the MFU target",
        "5%": "the data-wait target",
    },
    "benchmarks/hetero_balance.py": {"2x": "the slowdown the benchmark simulates (--simulate_slow_ranks 1:2.0)"},
    "benchmarks/planner_published.py": {"80GB": "the GPU's product name (H100 SXM 80GB)"},
    "benchmarks/variable_size_accuracy.py": {"5%": "the warm-up share the benchmark sets"},
    "hf_vit_scaling/data/host_transforms.py": {"8%": "torchvision's and timm's default crop scale (0.08, 1)"},
    "hf_vit_scaling/evaluation/classification_metrics.py": {"100%": "what a rule the code avoids would score"},
    "hf_vit_scaling/medical/duplicates.py": {"20%": "the size of a random hold-out split: a setting"},
    "hf_vit_scaling/models/flops.py": {
        "1%": "the share of O(N·D) element-wise work against O(N·D²) matrix products: an analytic bound",
        "80GB": "a device name as torch reports it (NVIDIA H100 80GB HBM3)",
    },
    "hf_vit_scaling/parallel/hetero.py": {"2x": BACKWARD_RULE},
    "hf_vit_scaling/planning/shapes.py": {"65-90%": "the planner's stated assumption for its link presets"},
    "hf_vit_scaling/throughput/report.py": {"5.9%": "an example of the printed line (its sum: throughput/summary.py)"},
    "hf_vit_scaling/throughput/summary.py": {"2x": BACKWARD_RULE},
    "hf_vit_scaling/throughput/timing.py": {"2x": f"{BACKWARD_RULE}; and the slow-rank simulator's backward sleep"},
    "hf_vit_scaling/training/faults.py": {"4 KiB": "the file-size limit the fault sets"},
    "hf_vit_scaling/training/interruption.py": {
        "30 s": "torchrun's wait before it kills its workers (LocalElasticAgent._shutdown): an upstream constant",
        "3 s": "the timer transformers' JITCheckpointCallback starts: an upstream constant",
    },
    "hf_vit_scaling/training/loader_workers.py": {"5 s": TORCH_JOIN},
    "hf_vit_scaling/training/model_hooks.py": {"2x": "the slow-rank simulator's backward sleep: a setting"},
    "hf_vit_scaling/training/run.py": {"5 s": TORCH_JOIN},
    "recipes/medical_brain_mri/evaluate_model.py": {"95%": "the bootstrap interval's level: a setting"},
    "recipes/plan.py": {"40GB": "a flag's value in the example command"},
    "recipes/pretrain_mae.py": {"25%": "the share of patches the encoder sees (mask ratio 0.75): a setting"},
    "tests/helpers/launchers.py": {"0.3 s": "the matmul probe's default duration (models/flops.py): a setting"},
}  # fmt: skip


def scanned_files() -> list[Path]:
    paths = [*(REPO / "hf_vit_scaling").rglob("*.py"), *(REPO / "recipes").rglob("*.py"),
             *(REPO / "benchmarks").rglob("*.py"), *(REPO / "tests" / "helpers").rglob("*.py")]  # fmt: skip
    return sorted(p for p in paths if not relative(p).startswith(FIGURE_CHECK))


def relative(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def paragraphs(source: str) -> list[list[tuple[int, str]]]:
    """The comments and docstrings of `source` as paragraphs of (line number, text): a run of comment lines, or a
    docstring's block between blank lines."""
    comments: list[tuple[int, str]] = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments.append((token.start[0], token.string.lstrip("#").strip()))
    found, run = [], []
    for line, text in comments:
        if run and line != run[-1][0] + 1:
            found.append(run)
            run = []
        run.append((line, text))
    found += [run] if run else []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring is None:
                continue
            block = []
            for offset, text in enumerate(docstring.splitlines()):
                if text.strip():
                    block.append((node.body[0].lineno + offset, text.strip()))
                elif block:
                    found.append(block)
                    block = []
            found += [block] if block else []
    return found


def findings(source: str) -> list[tuple[int, str, str]]:
    """(line, figure, the line's text) for each figure or version claim in `source`'s comments and docstrings that is
    neither arithmetic nor cited (allowances are applied by the caller)."""
    out = []
    for paragraph in paragraphs(source):
        cited = any(CITED.search(text) for _, text in paragraph)
        for line, text in paragraph:
            out += [(line, m.group(0).strip(), text) for m in VERSION.finditer(text)]
            if cited:
                continue
            arithmetic = EQUATION.search(text) and "measured" not in text.lower()
            if not arithmetic:
                out += [(line, m.group(0).strip(), text) for m in FIGURE.finditer(text)]
    return sorted(out)


def problems() -> list[str]:
    found, used = [], set()
    for path in scanned_files():
        name = relative(path)
        allowed = ALLOWED.get(name, {})
        for line, figure, text in findings(path.read_text(encoding="utf-8")):
            if figure in allowed and not VERSION.fullmatch(figure):
                used.add((name, figure))
                continue
            found.append(f"{name}:{line}: {figure!r} in {text!r}")
    stale = [f"{name}: allowance for {figure!r} matches no figure" for name, figures in ALLOWED.items()
             for figure in figures if (name, figure) not in used]  # fmt: skip
    return found + stale


def test_no_measured_figure_or_version_claim_in_code():
    """Each finding: move the fact to the page that discusses it (bound to a results file there, or labelled), and
    let the code name the page; or, when it is no measurement, show its arithmetic or list it in ALLOWED."""
    assert problems() == []


# The contrast: a measured figure and a version claim are found; arithmetic, a citation and a product are not.
CASES = {
    "a timing": ("# a blocking one made 75 ms steps 2.6% slower\nx = 1\n", ["2.6%", "75 ms"]),
    "a docstring's size": ('def f():\n    """Reports 1,585 MB however little it uses."""\n', ["1,585 MB"]),
    "a range": ("# took 6-9 s on the 2-core CPU\n", ["6-9 s"]),
    "a ratio": ("# ZeRO-2 ran 2.6x slower\n", ["2.6x"]),
    "a version": ('"""accelerate 1.15 turns FSDP on only for accelerator worlds."""\n', ["accelerate 1.15"]),
    "a version in a sum": ("# torch before 2.13 waits: 8 x 5 = 40\n", ["torch before 2.13"]),
    "measured arithmetic": ("# measured: 21.0 + 20.6 = 41.6 MiB\n", ["41.6 MiB"]),
    "arithmetic": ("# 16 x 1e9 / 8 = 2.0 GB per GPU\n", []),
    "a comparison": ("# targets: >= 50% MFU, data wait <= 5%\n", ["50%", "5%"]),
    "a cited figure": ("# H200 datasheet: 141 GB HBM3e,\n# 4.8 TB/s and 989 TFLOP/s, 50% more\n", []),
    "a product and symbols": ("# 2 x 3 tokens, 4h wide, ViT-B/16, lr 3e-5, v1.2, 2sb bytes\n", []),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_what_counts_as_a_figure(case):
    source, expected = CASES[case]
    assert sorted(figure for _, figure, _ in findings(source)) == sorted(expected)
