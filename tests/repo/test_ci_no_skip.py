"""Under CI=true a skipped test fails (tests/ci_no_skip.py); elsewhere it stays a skip."""

import os
import subprocess
import sys

import pytest

from tests.helpers.launchers import REPO

A_SKIPPING_TEST = """
import pytest

@pytest.mark.skipif(True, reason="Slurm not installed")
def test_needs_slurm():
    pass

def test_plain():
    pass
"""


# A skip decided at setup (skipif, as test_slurm.py's) becomes an error of that test, one at call time a failure:
# either way the run exits non-zero.
@pytest.mark.parametrize("ci, summary", [("true", "1 passed, 1 error"), ("", "1 passed, 1 skipped")])
def test_a_skip_fails_only_under_ci(tmp_path, ci, summary):
    (tmp_path / "test_skipping.py").write_text(A_SKIPPING_TEST)
    env = {**os.environ, "CI": ci, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.ci_no_skip", "-p", "no:cacheprovider",
                           str(tmp_path / "test_skipping.py")], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)  # fmt: skip
    assert summary in proc.stdout, proc.stdout[-2000:]
    assert (proc.returncode != 0) == bool(ci), proc.stdout[-2000:]
    if ci:
        assert "skipped under CI=true, where every test must run: Slurm not installed" in proc.stdout
