"""`# fmt: skip` in the package and the recipes only where `ruff format` would break a table's alignment: on the line
that closes a multi-line literal (list, tuple, dict, set or a comprehension of them) laid out as rows. Hand-aligned
calls and signatures are the formatter's to lay out (issue 54: the count had grown from 82 to 107)."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MARK = "# fmt: skip"
TABLES = (ast.List, ast.Tuple, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)


def skips_outside_tables(source: str) -> list[int]:
    """Line numbers of the `# fmt: skip` marks in `source` that close no multi-line literal."""
    closing = {node.end_lineno for node in ast.walk(ast.parse(source))
               if isinstance(node, TABLES) and node.end_lineno > node.lineno}  # fmt: skip
    return [number for number, line in enumerate(source.splitlines(), 1)
            if line.rstrip().endswith(MARK) and number not in closing]  # fmt: skip


def test_fmt_skip_closes_a_table_everywhere_in_the_package_and_recipes():
    found = {
        str(path.relative_to(REPO)): lines
        for folder in ("hf_vit_scaling", "recipes")
        for path in sorted((REPO / folder).rglob("*.py"))
        if (lines := skips_outside_tables(path.read_text(encoding="utf-8")))
    }
    assert not found, f"`{MARK}` on lines that close no table (let ruff format lay them out): {found}"


def test_the_check_finds_a_skipped_call_and_passes_a_table():
    call = "value = compute(first,\n                second)  # fmt: skip\n"
    table = "ROWS = [\n    (1, 2), (3, 4),\n]  # fmt: skip\n"
    assert skips_outside_tables(call) == [2]
    assert skips_outside_tables(table) == []
