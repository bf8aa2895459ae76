"""Training with a served engine: rollouts come from `tracerl serve` over HTTP, and after each update the server
holds the trainer's weights (policy.engine="openai", policy.sync_weights)."""

import json

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from tracerl.engines.transformers_engine import TransformersEngine
from tracerl.io.files.runlog import read_metrics
from tracerl.policy.embedded import EmbeddedConfig, build_embedded, load_embedded
from tracerl.serve.app import create_app
from tracerl.train.config import load_config
from tracerl.train.trainer import run_training

from helpers import thread_server


def test_training_through_tracerl_serve_keeps_the_server_on_the_latest_weights(tiny_overrides, tmp_path):
    overrides = dict(o.split("=", 1) for o in tiny_overrides)
    policy = build_embedded(EmbeddedConfig.from_dict(json.loads(overrides["policy.embedded"])),
                            overrides["policy.cache_dir"])
    served = load_embedded(policy.path).model  # a model of its own: the server's copy, not the trainer's
    with thread_server(create_app(TransformersEngine(served), "tiny")) as url:
        with torch.no_grad():  # the server starts from other weights: the run must push its own first
            for p in served.parameters():
                p.add_(0.01)
        config = load_config(None, [*tiny_overrides, f"run.out_dir={tmp_path / 'run'}", "method=grpo",
                                    "run.num_steps=2", "run.eval_prompts=2", "run.eval_samples=1",
                                    "policy.engine=openai", f"policy.base_url={url}"])
        run_training(config)
        rows = [r for r in read_metrics(tmp_path / "run") if r["kind"] == "train"]
        assert len(rows) == 2 and all(r["rollout/num_rollouts"] > 0 for r in rows)
        trained = torch.load(tmp_path / "run" / "checkpoints" / "step-000002" / "model.pt", weights_only=True)
        for name, value in served.state_dict().items():
            assert torch.equal(value, trained[name]), f"{name}: the server does not hold the trained weights"
