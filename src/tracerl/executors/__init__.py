"""Heavy-layer rollout executors: rollout workers on Ray (`RayRolloutRunner`) and starting Ray (`start_ray`).

Needs the `ray` extra (`pip install -e ".[ray]"`). The in-process runner is `tracerl.io.driver.ReActDriver`.
"""

from tracerl.executors.cluster import start_ray
from tracerl.executors.ray_runner import RayRolloutRunner, partition, worker_seed

__all__ = ["RayRolloutRunner", "partition", "start_ray", "worker_seed"]
