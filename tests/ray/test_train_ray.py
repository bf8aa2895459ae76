"""`tracerl train` with run.executor="ray": the step's rollouts run on Ray workers that are clients of `tracerl
serve`'s app (over a copy of the tiny policy, in a thread on loopback). One worker must sample exactly what the
in-process path samples through the same server; two workers train, log the keys a local run logs and leave the
server on the run's weights; the CLI starts and stops a loopback cluster of its own; bad configs fail at load."""

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

# tests/ is on sys.path (tests/conftest.py), where this folder would pass for a namespace package named ray
_spec = importlib.util.find_spec("ray")
if _spec is None or _spec.origin is None:
    pytest.skip("Ray is not installed: pip install -e \".[ray]\"", allow_module_level=True)

import ray  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[1] / "serve"))
from serve_support import thread_server  # noqa: E402

from tracerl.engines.transformers_engine import TransformersEngine  # noqa: E402
from tracerl.executors.ray_runner import WORKER_COUNTERS  # noqa: E402
from tracerl.io.files.runlog import read_metrics, read_trees  # noqa: E402
from tracerl.policy.embedded import load_embedded  # noqa: E402
from tracerl.serve.app import create_app  # noqa: E402
from tracerl.train import checkpoint, config as config_module  # noqa: E402
from tracerl.train.config import load_config  # noqa: E402
from tracerl.train.trainer import _check_run_dir, run_training  # noqa: E402

# rollout metrics the trainer always writes; every other rollout/ key is a runner counter
ROLLOUT_SUMMARY = {"rollout/success_rate", "rollout/num_rollouts", "rollout/units", "rollout/tokens",
                   "rollout/cum_units", "rollout/cum_tokens"}
TIMING = {"sys/step_seconds", "sys/rollout_seconds", "sys/train_seconds", "sys/alloc_seconds", "alloc/overhead_frac"}


def _overrides(policy, url: str, out: Path, *more: str) -> list[str]:
    """A trace run on the tiny policy that samples through the server at `url`: 16 budget units a step."""
    return [f"policy.embedded={json.dumps(policy.config.to_dict())}", f"policy.cache_dir={policy.path.parent}",
            "policy.engine=openai", f"policy.base_url={url}", "policy.served_model_name=tiny", "method=trace",
            "data.num_train_prompts=40", "allocation.num_prompts=4", "allocation.rollouts_per_prompt=4",
            "allocation.m_max=8", "run.eval_prompts=2", "run.eval_samples=1", "run.num_threads=1",
            "run.progress=false", "run.tensorboard=false", "optim.micro_batch_rollouts=8", f"run.out_dir={out}", *more]


def _train_rows(run_dir: Path) -> list[dict]:
    return [r for r in read_metrics(run_dir) if r["kind"] == "train"]


@pytest.fixture(scope="module")
def served(policy):
    """(base URL, model) of `tracerl serve`'s app over a model of its own: the runs push their weights into it."""
    copy = load_embedded(policy.path)
    with thread_server(create_app(TransformersEngine(copy.model, reuse_kv=False), "tiny", copy.tokenizer)) as url:
        yield url, copy.model


@pytest.fixture(scope="module")
def local_row(policy, served, tmp_path_factory):
    """The one train row of a step sampled in this process through the server: what the Ray runs are held to."""
    out = tmp_path_factory.mktemp("local") / "run"
    run_training(load_config(None, _overrides(policy, served[0], out, "run.num_steps=1")))
    (row,) = _train_rows(out)
    return out, row


def test_one_worker_samples_what_the_local_executor_samples(policy, served, local_row, ray_cluster, tmp_path):
    local_dir, local = local_row
    out = tmp_path / "run"
    run_training(load_config(None, _overrides(policy, served[0], out, "run.num_steps=1", "run.executor=ray",
                                              "run.num_workers=1")))
    (row,) = _train_rows(out)
    assert set(row) == set(local) | set(WORKER_COUNTERS), "the Ray run logs other keys than the local run"
    assert all(row[k] == 0 for k in WORKER_COUNTERS), row
    assert read_trees(out)["trees"] == read_trees(local_dir)["trees"], \
        "worker 0 must sample with the step's seed, as the in-process driver does"
    same = set(local) - TIMING
    assert {k: row[k] for k in same} == {k: local[k] for k in same}


def test_two_workers_train_log_the_local_keys_and_sync_the_server(policy, served, local_row, ray_cluster, tmp_path):
    url, served_model = served
    _, local = local_row
    out = tmp_path / "run"
    with torch.no_grad():  # the server starts from other weights: the run must push its own first
        for p in served_model.parameters():
            p.add_(0.01)
    result = run_training(load_config(None, _overrides(policy, url, out, "run.num_steps=2", "run.executor=ray",
                                                       "run.num_workers=2")))
    rows = _train_rows(out)
    assert result["steps"] == 2 and [r["step"] for r in rows] == [1, 2]
    fixed = {k for k in local if not k.startswith("rollout/") or k in ROLLOUT_SUMMARY}
    for row in rows:
        assert fixed <= set(row), f"missing {sorted(fixed - set(row))}"
        counters = set(row) - fixed
        assert all(k.startswith("rollout/") for k in counters), sorted(counters)
        assert set(WORKER_COUNTERS) <= counters and "rollout/turns" in counters, sorted(counters)
        assert row["rollout/worker_errors"] == row["rollout/worker_restarts"] == 0, row
        assert row["rollout/num_rollouts"] > 0 and row["rollout/units"] <= 16
    assert sum(r["alloc/num_prefix_anchors"] for r in rows) > 0, "no continuation ran on the workers"
    # weight sync is the trainer's, unchanged: the run pushed its weights to the server (this tiny policy rarely
    # succeeds, so they seldom move here; tests/e2e/test_train_served.py checks the sync after updates)
    trained = torch.load(out / "checkpoints" / "step-000002" / "model.pt", weights_only=True)
    for name, value in served_model.state_dict().items():
        assert torch.equal(value, trained[name]), f"{name}: the server does not hold the trained weights"
    # the run stopped its workers: their CPUs are free again (Ray releases them asynchronously)
    deadline = time.monotonic() + 120
    while ray.available_resources().get("CPU", 0) < ray.cluster_resources()["CPU"]:
        assert time.monotonic() < deadline, f"timeout: workers still hold CPUs after 120 s: {ray.available_resources()}"
        time.sleep(0.1)


def test_cli_executor_ray_starts_and_stops_a_loopback_cluster(policy, served, tmp_path):
    out = tmp_path / "run"
    sets = [a for o in _overrides(policy, served[0], out, "run.num_steps=1", "run.num_workers=2")
            if not o.startswith("run.out_dir=") for a in ("--set", o)]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # not the test session's cluster
    done = subprocess.run([sys.executable, "-m", "tracerl.cli", "train", "--executor", "ray", "--out", str(out),
                           *sets], capture_output=True, text=True, timeout=300, env={**env, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 rollout workers on Ray" in done.stderr, done.stderr[-3000:]
    assert json.loads((out / "config.json").read_text())["run"]["executor"] == "ray"
    (row,) = _train_rows(out)
    assert row["rollout/num_rollouts"] > 0 and row["rollout/worker_errors"] == 0


def test_executor_ray_needs_a_served_engine_ray_and_a_worker(monkeypatch):
    served = ["policy.engine=openai", "policy.base_url=http://127.0.0.1:8000"]
    with pytest.raises(ValueError, match="set policy.engine=openai and policy.base_url"):
        load_config(None, ["run.executor=ray"])  # policy.engine=transformers: nothing for workers to call
    with pytest.raises(ValueError, match=r"run.num_workers=0 must be >= 1"):
        load_config(None, [*served, "run.executor=ray", "run.num_workers=0"])
    with pytest.raises(ValueError, match="run.executor='dask' must be one of 'local', 'ray'"):
        load_config(None, [*served, "run.executor=dask"])
    monkeypatch.setattr(config_module, "_has_ray", lambda: False)
    with pytest.raises(ValueError, match=r'pip install -e "\.\[ray\]"'):
        load_config(None, [*served, "run.executor=ray"])
    assert load_config(None, ["run.executor=local"]).run.executor == "local"  # local needs neither


def test_resume_may_move_the_cluster_but_not_change_the_workers(tmp_path):
    base = ["policy.engine=openai", "policy.base_url=http://127.0.0.1:8000", f"run.out_dir={tmp_path}"]
    config = load_config(None, [*base, "run.executor=ray", "run.num_workers=2"])
    checkpoint.save_config(tmp_path, config.to_dict())
    _check_run_dir(load_config(None, [*base, "run.executor=ray", "run.num_workers=2", "run.ray_address=auto"]),
                   resume=True)
    for change in ("run.num_workers=3", "run.executor=local"):
        with pytest.raises(ValueError, match=change.split("=")[0]):
            _check_run_dir(load_config(None, [*base, "run.executor=ray", "run.num_workers=2", change]), resume=True)
    # a run saved before these keys existed resumes with their defaults, and only with them
    saved = config.to_dict()
    saved["run"] = {k: v for k, v in saved["run"].items() if k not in ("executor", "num_workers", "ray_address")}
    checkpoint.save_config(tmp_path, saved)
    _check_run_dir(load_config(None, base), resume=True)
    with pytest.raises(ValueError, match="run.executor"):
        _check_run_dir(config, resume=True)
