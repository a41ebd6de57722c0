"""The suite's tiers (tests/tiers.py): every extended entry names a test that exists (a renamed test would else
silently return to `make test`), and the engine-variant rule marks launched cells only."""

import re
from pathlib import Path

from tests.tiers import EXTENDED, is_extended

LAUNCHED = Path(__file__).resolve().parents[1] / "launched"


def test_every_extended_entry_names_an_existing_test_and_cell():
    for key in EXTENDED:
        file, _, rest = key.partition("::")
        name, _, cell = rest.partition("[")
        source = (LAUNCHED / file).read_text(encoding="utf-8")
        assert re.search(rf"^def {re.escape(name)}\w*\(", source, re.M), f"{key}: no such test in {file}"
        for part in cell.rstrip("]").split("-") if cell else []:
            assert part in source, f"{key}: no cell {part!r} in {file}"


def test_engine_variants_are_extended_in_launched_tests_only():
    assert is_extended("tests/launched/test_fsdp.py::test_loss_curve_and_weights_equal_plain_ddp[zero1]", ["zero1"])
    assert is_extended("tests/launched/test_fsdp.py::test_saved_model_reloads_in_a_pipeline[fsdp2]", ["fsdp2"])
    assert not is_extended("tests/launched/test_fsdp.py::test_saved_model_reloads_in_a_pipeline[fsdp2_sharded]",
                           ["fsdp2_sharded"])  # fmt: skip
    assert not is_extended("tests/launched/test_fsdp.py::test_loss_curve_and_weights_equal_plain_ddp[zero2]",
                           ["zero2"])  # fmt: skip
    assert not is_extended("tests/unit/planning/test_teacher.py::test_x[zero1-fp32]", ["zero1", "fp32"])
    assert not is_extended("tests/launched/test_recipe_distributed.py::test_launchers_two_processes[deepspeed-zero1]",
                           ["deepspeed", "zero1"])  # fmt: skip
