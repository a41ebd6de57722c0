"""The compile_speed table (benchmarks/table_renderers.py) from what `benchmarks/synthetic_floor.py --compile` writes:
its per-run records summarised by the script's own `compile_summary`, so the script and the table cannot drift apart
before the measured results file exists (the real run needs a quiet machine)."""

import importlib.util
import sys

from tests.helpers.launchers import REPO

sys.path.insert(0, str(REPO / "benchmarks"))  # as when run as a script: each imports its neighbours
import table_renderers  # noqa: E402

spec = importlib.util.spec_from_file_location("synthetic_floor", REPO / "benchmarks" / "synthetic_floor.py")
synthetic_floor = importlib.util.module_from_spec(spec)
spec.loader.exec_module(synthetic_floor)


def run(step_s: float, compiled: bool, ranks: int = 1, after_warmup: int = 0) -> dict:
    """One arm's run as `floor` / `recipe` return it."""
    return {
        "step_s": step_s,
        "warmup_s": 30.0 if compiled else 1.0,
        "graphs_per_rank": [2] * ranks if compiled else [0] * ranks,
        "graphs_after_warmup": after_warmup,
        "compile_s": 25.0 if compiled else 0.0,
        "compiled_within_warmup": (after_warmup == 0) if compiled else None,
    }


def arm(eager_s: float, compiled_s: float, ranks: int = 1, after_warmup: int = 0) -> dict:
    return {"eager": run(eager_s, False, ranks), "compiled": run(compiled_s, True, ranks, after_warmup),
            "speedup": eager_s / compiled_s}  # fmt: skip


def rendered_rows() -> list[str]:
    """Two rounds of ZeRO-2 (floor and recipe) and FSDP2 (the recipe alone, 2 ranks; recompiled after warm-up in
    round 2): floor speedups 1.5 and 1.7, recipe 1.2 and 1.25."""
    rounds = [
        {"order": ["eager", "compiled"], "zero2": {"floor": arm(0.015, 0.010), "recipe": arm(0.030, 0.025)},
         "fsdp2": {"recipe": arm(0.040, 0.040, ranks=2)}},
        {"order": ["compiled", "eager"], "zero2": {"floor": arm(0.017, 0.010), "recipe": arm(0.025, 0.020)},
         "fsdp2": {"recipe": arm(0.040, 0.050, ranks=2, after_warmup=3)}},
    ]  # fmt: skip
    result = {"median_over_rounds": synthetic_floor.compile_summary(rounds, ["zero2", "fsdp2"]), "rounds": rounds}
    return table_renderers.compile_speed(result).splitlines()[2:]


def test_compile_speed_table_shows_each_arms_speedup_spread_and_warmup():
    """Fails if the table drops an arm, shows a floor row for an engine measured by its recipe alone, reports the
    speedup's median or min-max wrong (e.g. `compile_summary` taking the speedup of the median steps, or the
    renderer showing one bound twice), or says a run that recompiled after warm-up compiled within it (e.g.
    `compile_summary` using any() over rounds instead of all())."""
    rows = rendered_rows()
    assert [row.split(" | ")[:2] for row in rows] == [
        ["| ZeRO-2", "floor"], ["| ZeRO-2", "recipe"], ["| FSDP2 (2 processes)", "recipe"]
    ]  # fmt: skip
    floor, recipe, fsdp = rows
    assert "| 16.0 ms | 10.0 ms | 1.60× (1.50-1.70) |" in floor
    assert "| 1.23× (1.20-1.25) |" in recipe
    assert "| 1.0 / 30.0 s | 25.0 s | 2 | 0 | yes |" in floor
    assert "| 0.90× (0.80-1.00) |" in fsdp and "| 2, 2 | 3 | **no** |" in fsdp
