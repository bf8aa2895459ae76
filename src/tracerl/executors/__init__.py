"""Where rollouts run: `make_runner` (a local driver or Ray workers behind one interface), rollout workers on Ray
(`RayRolloutRunner`) and starting Ray (`start_ray`).

The Ray parts need the `ray` extra (`pip install -e ".[ray]"`) and are imported on first use, so the local runner
works without Ray.
"""

from tracerl.executors.runner import LocalRunner, RayRunner, make_runner

_RAY_NAMES = {"RayRolloutRunner": "ray_runner", "partition": "ray_runner", "worker_seed": "ray_runner",
              "start_ray": "cluster"}

__all__ = ["LocalRunner", "RayRunner", "make_runner", *_RAY_NAMES]


def __getattr__(name: str):
    if name in _RAY_NAMES:
        import importlib

        return getattr(importlib.import_module(f"tracerl.executors.{_RAY_NAMES[name]}"), name)
    raise AttributeError(f"module 'tracerl.executors' has no attribute {name!r}")
