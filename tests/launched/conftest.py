"""Fixtures of the launched tests: `engine_runs` (tests/helpers/engine_runs.py), one run per engine, made on
first use and shared by every test that checks it."""

import pytest

from tests.helpers.engine_runs import EngineRuns, engine_runs_for


@pytest.fixture(scope="session")
def engine_runs(tmp_path_factory) -> EngineRuns:
    return engine_runs_for(tmp_path_factory)
