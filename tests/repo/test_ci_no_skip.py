"""Under CI=true a skipped, xfailed or xpassed test fails (tests/ci_no_skip.py); elsewhere each stays what it is."""

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

# A skip at collection time: the module's tests never exist, so no test report carries the skip.
A_MODULE_SKIPPING_TEST = """
import pytest

pytest.importorskip("no_such_module")

def test_never_collected():
    pass
"""

A_PASSING_TEST = """
def test_plain():
    pass
"""

AN_XFAILING_TEST = """
import pytest

@pytest.mark.xfail(reason="known upstream bug")
def test_expected_to_fail():
    assert False

@pytest.mark.xfail(reason="fixed long ago")
def test_passes_despite_its_xfail():
    pass

def test_plain():
    pass
"""


def run_pytest(tmp_path, source: str, ci: str, beside: str | None = None) -> subprocess.CompletedProcess:
    """pytest with the plugin on `source` (and on a second module `beside`, when given)."""
    (tmp_path / "test_example.py").write_text(source)
    if beside is not None:
        (tmp_path / "test_beside.py").write_text(beside)
    env = {**os.environ, "CI": ci, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "tests.ci_no_skip", "-p",
                           "no:cacheprovider", str(tmp_path)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120)  # fmt: skip


# A skip decided at setup (skipif, as test_slurm.py's) becomes an error of that test, one at call time a failure:
# either way the run exits non-zero.
@pytest.mark.parametrize("ci, summary", [("true", "1 passed, 1 error"), ("", "1 passed, 1 skipped")])
def test_a_skip_fails_only_under_ci(tmp_path, ci, summary):
    proc = run_pytest(tmp_path, A_SKIPPING_TEST, ci)
    assert summary in proc.stdout, proc.stdout[-2000:]
    assert (proc.returncode != 0) == bool(ci), proc.stdout[-2000:]
    if ci:
        assert "skipped under CI=true, where every test must run: Slurm not installed" in proc.stdout


# A module-level importorskip skips at collection: under CI that is a collection error (pytest exits 2), beside a
# module that passes.
@pytest.mark.parametrize("ci, summary", [("true", "1 error"), ("", "1 passed, 1 skipped")])
def test_a_skip_at_collection_fails_only_under_ci(tmp_path, ci, summary):
    proc = run_pytest(tmp_path, A_MODULE_SKIPPING_TEST, ci, beside=A_PASSING_TEST)
    assert summary in proc.stdout, proc.stdout[-2000:]
    assert (proc.returncode != 0) == bool(ci), proc.stdout[-2000:]
    if ci:
        assert (
            "skipped at collection under CI=true, where every test must run: could not import 'no_such_module'"
            in proc.stdout
        ), proc.stdout[-2000:]


@pytest.mark.parametrize("ci, summary", [("true", "2 failed, 1 passed"), ("", "1 passed, 1 xfailed, 1 xpassed")])
def test_an_xfail_and_an_xpass_fail_only_under_ci(tmp_path, ci, summary):
    """Fails if the plugin lets a report with `wasxfail` through (the xfail would pass CI in silence), or turns only
    xfails, not xpasses, into failures."""
    proc = run_pytest(tmp_path, AN_XFAILING_TEST, ci)
    assert summary in proc.stdout, proc.stdout[-2000:]
    assert (proc.returncode != 0) == bool(ci), proc.stdout[-2000:]
    if ci:
        assert "xfailed under CI=true, where every test must run and pass: xfail reason: known upstream bug" in (
            proc.stdout
        ), proc.stdout[-2000:]
        assert "xpassed under CI=true, where every test must run and pass: xfail reason: fixed long ago" in (
            proc.stdout
        ), proc.stdout[-2000:]


def test_ci_entry_point_sets_ci_itself_before_any_test_runs():
    """.ci/run exports CI=true above its first make, so the plugin holds whatever the CI service sets."""
    lines = (REPO / ".ci" / "run").read_text().splitlines()
    first_make = next(i for i, line in enumerate(lines) if line.startswith("make "))
    assert "export CI=true" in lines[:first_make], lines[:first_make]
