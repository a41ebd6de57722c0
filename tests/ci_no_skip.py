"""A pytest plugin: under CI=true a test that would be skipped, xfail or xpass fails instead, naming why.

CI is where the whole suite must run: a test that skips there (Slurm not installed, a daemon that did not start)
hides a check in silence, so .ci/run installs what the tests need and this plugin makes a miss visible. An xfail
hides a check the same way (its failure is expected, so it never fails), and an xpass is an xfail whose reason no
longer holds: both fail under CI=true, with the xfail's reason. Outside CI (a developer's machine without Slurm)
skips, xfails and xpasses stay what they are.

A skip at collection time (a module-level `pytest.importorskip` or `pytest.skip(allow_module_level=True)`) skips
every test of its module before any test exists to report it, so it is caught on the collection report: under
CI=true it becomes a collection error, and pytest exits non-zero."""

import os

import pytest


def ci_forbids_skips() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def skip_reason(longrepr) -> str:
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if ci_forbids_skips() and report.skipped:
        reason = skip_reason(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped at collection under CI=true, where every test must run: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not ci_forbids_skips():
        return
    if hasattr(report, "wasxfail"):
        kind = "xfailed" if report.skipped else "xpassed"
        reason = report.wasxfail or "no reason given"
        del report.wasxfail  # else the summary would still count it as an xfail/xpass
        report.outcome = "failed"
        report.longrepr = f"{kind} under CI=true, where every test must run and pass: xfail reason: {reason}"
    elif report.skipped:
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, where every test must run: {skip_reason(report.longrepr)}"
