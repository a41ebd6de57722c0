"""hf_vit_scaling/parallel/fast_paths/README.md read against the registry (`registry.FAST_PATHS`): every fast path has
its row, with the DeepSpeed methods it pins and their hashes, and every row names a registered path."""

import re
from pathlib import Path

from hf_vit_scaling.parallel.fast_paths.registry import FAST_PATHS, FastPath

README = Path(__file__).resolve().parents[3] / "hf_vit_scaling" / "parallel" / "fast_paths" / "README.md"


def readme_rows(text: str) -> list[tuple[list[str], str]]:
    """([the fast paths the row's first cell names], the row's pins cell) of the table of fast paths."""
    rows = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and re.search(r"`[0-9a-f]{16}`", cells[1]):
            rows.append((re.findall(r"`(\w+)`", cells[0]), cells[1]))
    return rows


def pins_of(path: FastPath) -> list[tuple[str, str]]:
    return [(path.attribute, path.source_sha), *path.also_pins]


def problems(text: str, fast_paths=FAST_PATHS) -> list[str]:
    rows, found = readme_rows(text), []
    for path in fast_paths:
        row = next((pins for names, pins in rows if path.name in names), None)
        if row is None:
            found.append(f"{path.name}: no row")
            continue
        found += [f"{path.name}: {attribute} `{sha}` not in its row" for attribute, sha in pins_of(path)
                  if not re.search(rf"`[\w.]*\b{attribute}` `{sha}`", row)]  # fmt: skip
    registered = {path.name for path in fast_paths}
    found += [f"{name}: in the README, not in FAST_PATHS" for names, _ in rows for name in names
              if name not in registered]  # fmt: skip
    return found


def test_every_fast_path_is_documented_with_its_pins():
    assert problems(README.read_text(encoding="utf-8")) == []


def test_a_repinned_missing_or_unknown_path_is_a_problem():
    text = README.read_text(encoding="utf-8")
    path = next(p for p in FAST_PATHS if p.also_pins)
    repinned = text.replace(f"`{path.source_sha}`", "`0123456789abcdef`")
    assert problems(repinned) == [f"{path.name}: {path.attribute} `{path.source_sha}` not in its row"]
    missing = "\n".join(line for line in text.splitlines() if not line.startswith("| `cpu_numa_cores_once`"))
    assert problems(missing) == ["cpu_numa_cores_once: no row"]
    unknown = text.replace("| `cpu_numa_cores_once` |", "| `cpu_numa_cores_once`, `no_such_path` |")
    assert problems(unknown) == ["no_such_path: in the README, not in FAST_PATHS"]
