"""TrainConfig: presets in configs/ load, and bad configs fail at load with the fix in the message."""

from pathlib import Path

import pytest

from tracerl.core.methods import METHODS
from tracerl.train.config import load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_every_preset_loads():
    presets = sorted(CONFIGS.glob("*.toml"))
    assert presets, f"no presets in {CONFIGS}"
    for path in presets:
        if path.stem.startswith(("math", "funcall", "bfcl")):
            with pytest.raises(ValueError, match="model directory"):
                load_config(path)  # these need a real model: the embedded one knows multi-hop QA only
            assert load_config(path, [f"policy.model={CONFIGS}"]).data.domain == path.stem
        else:
            config = load_config(path)
            assert config.method in METHODS


@pytest.mark.parametrize("override, message", [
    ("method=ppo", "method='ppo' is unknown; use one of"),
    ("method=trace-oracle", "only the simulator knows"),
    ("data.domain=math", "the embedded policy is trained on multihop only"),
    ("policy.model=/no/such/model", "neither 'embedded', a local model directory nor a hub id"),
    ("optim.lr=-1", "optim.lr must be > 0"),
    ("optim.agg=sum", "optim.agg='sum'; use token-mean or seq-mean-token-mean"),
    ("allocation.rollouts_per_prompt=1", "rollouts_per_prompt=1 must be >= 2"),
    ("allocation.num_prompts=0", "num_prompts=0 must be >= 1"),
    ("predictor.name=oracle", "the oracle exists only in the simulator"),
    ("run.num_steps=0", "run.num_steps=0"),
    ("sampling.temperature=0", "RL needs stochastic rollouts"),
    ("run.nm_steps=3", r"run: unknown key\(s\) \['nm_steps'\]"),
    ("policy.engine=vllm", "use 'transformers' or 'openai'"),
    ("policy.engine=openai", "needs policy.base_url=http://host:port"),
])
def test_bad_configs_fail_at_load(override, message):
    with pytest.raises(ValueError, match=message):
        load_config(None, [override])


def test_cli_reports_config_errors_without_a_traceback(capsys):
    from tracerl.cli import main

    assert main(["train", "--set", "optim.lr=fast"]) == 2
    assert "optim.lr: expected a number, got 'fast'" in capsys.readouterr().err


def test_a_run_directory_is_never_overwritten_and_resume_keeps_the_config(tmp_path):
    import json

    from tracerl.train.trainer import run_training

    config = load_config(None, [f"run.out_dir={tmp_path}"])
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match="already holds a run; pass --resume"):
        run_training(config)
    (tmp_path / "config.json").write_text(json.dumps(load_config(None, ["optim.lr=0.1"]).to_dict()))
    with pytest.raises(ValueError, match=r"differs from .*config.json in \['optim.lr', 'run.out_dir'\]"):
        run_training(config, resume=True)


def test_a_hub_id_passes_the_config_and_fails_clearly_when_it_cannot_be_loaded(monkeypatch, tmp_path):
    from tracerl.train.policy import load_policy

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # as on a machine without the hub: nothing cached, nothing reachable
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    config = load_config(None, ["policy.model=Qwen/Qwen3-0.6B", "data.domain=funcall"])
    with pytest.raises(ValueError, match="(?s)could not load policy.model='Qwen/Qwen3-0.6B'.*pass a local model"):
        load_policy(config)
