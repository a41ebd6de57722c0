"""A pytest plugin: under CI=true a test that would be skipped, xfail or xpass fails instead, naming why.

CI is where the whole suite must run: a test that skips there (Slurm not installed, a daemon that did not start)
hides a check in silence, so .ci/run installs what the tests need and this plugin makes a miss visible. An xfail
hides a check the same way (its failure is expected, so it never fails), and an xpass is an xfail whose reason no
longer holds: both fail under CI=true, with the xfail's reason. Outside CI (a developer's machine without Slurm)
skips, xfails and xpasses stay what they are."""

import os

import pytest


def ci_forbids_skips() -> bool:
    return os.environ.get("CI", "").lower() == "true"


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
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, where every test must run: {reason}"
