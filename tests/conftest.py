"""Shared by every test folder: tests/helpers.py on the path, and the `slow` marker on what trains, builds a policy
or starts servers, so `python -m pytest -q -m "not slow"` is the fast loop (tests/README.md has the map)."""

import pathlib
import sys

import pytest

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE))  # tests/helpers.py

try:  # hypothesis's default per-example deadline (200 ms) is a wall-clock assert: a loaded machine fails it
    from hypothesis import settings

    settings.register_profile("any-load", deadline=None)
    settings.load_profile("any-load")
except ImportError:  # the verl and vLLM environments may not have it; their tests do not use it
    pass

# folders and files whose tests take seconds to minutes each (training steps, policy builds, servers, Ray, a browser)
SLOW = ("e2e", "ray", "view/test_view_browser.py", "serve", "torch/test_embedded.py", "torch/test_lora.py",
        "unit/test_fuzz_driver.py", "sandbox/test_sandbox_nonroot.py", "predictors/test_lm_value.py",
        "unit/test_studies.py", "verl/test_verl_main_ppo.py")
# folders and files whose tests train, evaluate or compare the policies the tests build (seeded by helpers.BUILD_SEED):
# `.ci/run` runs them again under a second build seed (marker `builds`), so a test that holds only for the weights one
# machine builds fails there
BUILDS = ("e2e", "ray", "predictors", "torch/test_embedded.py", "torch/test_embedded_domains.py")


def pytest_collection_modifyitems(items):
    for item in items:
        where = pathlib.Path(str(item.fspath)).relative_to(HERE).as_posix()
        if any(where == s or where.startswith(s + "/") for s in SLOW):
            item.add_marker(pytest.mark.slow)
        if any(where == s or where.startswith(s + "/") for s in BUILDS):
            item.add_marker(pytest.mark.builds)
