"""docs/layout.md's walks (where each traced flag's value goes) are the ones a run traces today:
`tools/trace_flags.py --check` runs the recipe once with its recorders on and fails naming each flag whose walk
differs, with the command that rewrites them."""

import sys

import pytest

from tests.helpers.launchers import REPO, run

sys.path.insert(0, str(REPO / "tools"))
import trace_flags  # noqa: E402 (tools/trace_flags.py: a script, imported by path)


@pytest.mark.distributed  # one process, but DeepSpeed's process group over gloo and a compiled step: about a minute
def test_walks_in_layout_md_are_the_traced_ones():
    proc = run([sys.executable, REPO / "tools" / "trace_flags.py", "--check"], timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_stale_walk_is_named_with_its_fix():
    row = "| `--mixup_alpha` | `arguments/regularization.py` (`__post_init__`) | 1 | 0 |"
    other = "| `--layer_decay` | `training/trainer.py` (`__init__`) | 1 | 0 |"
    old, new = f"{row}\n{other}\n", f"{row.replace('1 | 0', '2 | 0')}\n{other}\n"
    assert trace_flags.differing(old, new) == ["--mixup_alpha"]
    assert trace_flags.differing(old, old) == []
    assert trace_flags.differing(old, old + "notes\n") == ["(the block's notes)"]
