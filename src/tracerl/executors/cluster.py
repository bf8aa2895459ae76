"""Starting Ray for rollout workers: a small local cluster bound to loopback, or a connection to an existing one.

`start_ray()` with no address starts a one-node cluster in this process whose GCS, raylet, object manager and worker
servers listen on 127.0.0.1 only, with no dashboard, no usage-stats reporting, explicit small CPU and object-store
sizes, and worker logs kept out of the driver's output (they stay in Ray's session folder, /tmp/ray/session_latest).
`start_ray("auto")` or `start_ray("ray://head:10001")` connects to a cluster you started (`ray start --head ...`).

How loopback is obtained: Ray binds its servers to the node's address and takes the node's address from the
machine's outward-facing interface unless clusters are switched off (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, despite
its name honoured on Linux too), in which case the node is 127.0.0.1. `start_ray` sets that switch while Ray starts
(the GCS and raylet inherit it) and checks the result; a node that is not on loopback is shut down with an error.

What it does not do: stop the cluster (`ray.shutdown()`), start a multi-node cluster, secure one you connect to, or
ship tracerl to remote workers (install it there, or pass a `runtime_env` to your own `ray.init`).
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from typing import Any, Iterator

LOOPBACK = ("127.0.0.1", "::1", "localhost")
# set while a local cluster starts: the node (and so every server Ray binds) on loopback; no usage reports; workers
# at the driver's priority (Ray renices them to 15, and the rollout workers are the run's own sampling: beside other
# CPU-bound jobs a niced worker got about 2% of a core and a step stalled)
LOCAL_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0", "RAY_worker_niceness": "0"}


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def start_ray(address: str | None = None, num_cpus: int = 2, object_store_bytes: int = 100 * 2**20) -> dict[str, Any]:
    """Start a loopback-only local Ray cluster (address=None) or connect to one ("auto", "ray://host:port",
    "host:port"); returns Ray's address info (`node_ip_address`, `gcs_address`, ...).

    `num_cpus` and `object_store_bytes` size the local cluster (Ray needs at least 75 MiB of object store); they are
    ignored when connecting, where the cluster's own sizes hold."""
    try:
        import ray
        from ray._private import ray_constants
    except ImportError as err:
        raise ImportError("start_ray needs Ray: pip install -e \".[ray]\"") from err
    if ray.is_initialized():
        raise RuntimeError("Ray is already initialised in this process; use it as is, or call ray.shutdown() "
                           "before start_ray")
    quiet = {"log_to_driver": False, "logging_level": logging.WARNING}
    if address is not None:
        return dict(ray.init(address=address, **quiet).address_info)
    if num_cpus < 1 or object_store_bytes < 75 * 2**20:
        raise ValueError(f"num_cpus={num_cpus} must be >= 1 and object_store_bytes={object_store_bytes} >= 75 MiB "
                         f"({75 * 2**20}), Ray's minimum")
    # the switch is read when ray is imported; set the module's copy too in case ray was imported before
    cluster_switch = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        with _environment(LOCAL_ENV):
            info = dict(ray.init(num_cpus=num_cpus, object_store_memory=object_store_bytes, include_dashboard=False,
                                 **quiet).address_info)
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = cluster_switch
    if info.get("node_ip_address") not in LOOPBACK:
        ray.shutdown()
        raise RuntimeError(f"the local Ray node came up on {info.get('node_ip_address')}, not loopback (this Ray "
                           f"version ignores RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0); install the version the `ray` extra "
                           f"pins, or start Ray yourself and pass its address")
    return info
