"""A pytest plugin: under CI=true a test that would be skipped fails instead, naming why it would have skipped.

CI is where the whole suite must run: a test that skips there (Slurm not installed, a daemon that did not start)
hides a check in silence, so .ci/run installs what the tests need and this plugin makes a miss visible. Outside CI
(a developer's machine without Slurm) skips stay skips."""

import os

import pytest


def ci_forbids_skips() -> bool:
    return os.environ.get("CI", "").lower() == "true"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and ci_forbids_skips() and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, where every test must run: {reason}"
