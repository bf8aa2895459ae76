"""Fixtures of the viewer and report tests: run directories built by `view_fixtures`."""

import pytest
from view_fixtures import make_run


@pytest.fixture
def run_dir(tmp_path):
    return make_run(tmp_path / "trace-run")


@pytest.fixture
def grpo_run_dir(tmp_path):
    return make_run(tmp_path / "grpo-run", method="grpo", with_p=False)
