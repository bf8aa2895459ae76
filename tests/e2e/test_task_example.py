"""The inventory example (examples/inventory) end to end on a tiny build: its data script, the embedded policy's
warm start on the task's expert, and TRACE steps whose continuations replay the SQLite tool's calls."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import BUILD_SEED

from tracerl.io.files.runlog import read_metrics, read_trees
from tracerl.train.config import load_config
from tracerl.train.trainer import run_training

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "inventory"
TINY = {"seed": BUILD_SEED, "num_train_rows": 60, "p_noise_turn": 0.25, "sft_steps": 40, "batch_size": 4,
        "vocab_size": 400, "hidden_size": 32, "num_layers": 1, "max_turns": 4, "max_tokens_per_turn": 40,
        "max_tokens_per_rollout": 300,
        "num_eval_prompts": 4, "eval_samples_per_prompt": 1, "lr": 1e-2}


def test_the_inventory_example_trains_with_continuations(tmp_path):
    data = tmp_path / "data"
    subprocess.run([sys.executable, str(EXAMPLE / "make_data.py"), "--num-train", "60", "--num-test", "6",
                    "--out", str(data)], check=True, capture_output=True)
    overrides = [f"data.task={EXAMPLE / 'task.py'}:make_task",
                 f"data.train_files={json.dumps([str(data / 'train.jsonl')])}",
                 f"data.test_files={json.dumps([str(data / 'test.jsonl')])}", f"policy.embedded={json.dumps(TINY)}",
                 f"policy.cache_dir={tmp_path / 'cache'}", f"run.out_dir={tmp_path / 'run'}", "run.num_steps=2",
                 "run.eval_prompts=6", "run.eval_samples=1", "run.num_threads=1", "run.progress=false",
                 "run.tensorboard=false", "allocation.num_prompts=4", "allocation.rollouts_per_prompt=4",
                 "allocation.m_max=8", "optim.micro_batch_rollouts=8", "method=trace"]
    config = load_config(str(EXAMPLE / "config.toml"), overrides)
    assert config.data.domain == "task"
    result = run_training(config)
    rows = read_metrics(config.out_dir())
    assert [r["step"] for r in rows if "rollout/units" in r] == [1, 2]
    assert 0 <= result["before"]["eval/success"] <= 1 and 0 <= result["after"]["eval/success"] <= 1
    assert sum(r.get("rollout/env_exceptions", 0) for r in rows) == 0, "replay or the reward failed in a step"
    trees = [tree for step in (1, 2) for tree in read_trees(config.out_dir(), step)["trees"]]
    nodes = [node for tree in trees for node in tree["nodes"]]
    assert any(node["origin"] == "continuation" for node in nodes), "no continuation branched: replay went untested"
    assert any('"sell"' in node["segment"]["policy_text"] for node in nodes), "the SQLite tool was never called"
