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
        if path.stem.startswith("bfcl"):
            with pytest.raises(ValueError, match="model directory"):
                load_config(path)  # BFCL needs a real model: the embedded policy has no warm start for it
            assert load_config(path, [f"policy.model={CONFIGS}"]).data.domain == path.stem
        elif path.stem.startswith(("math", "funcall")):  # their own embedded warm start, or a real model
            assert load_config(path).data.domain == path.stem
            assert load_config(path, [f"policy.model={CONFIGS}"]).data.domain == path.stem
        else:
            config = load_config(path)
            assert config.method in METHODS


@pytest.mark.parametrize("override, message", [
    ("method=ppo", "method='ppo' must be one of 'grpo', 'pcl'"),
    ("method=trace-oracle", "only the simulator knows"),
    ("data.domain=bfcl", "does not learn BFCL"),
    ("policy.model=/no/such/model", "neither 'embedded', a local model directory nor a hub id"),
    ("optim.lr=-1", r"optim.lr=-1.0 must be > 0"),
    ("run.total_token_budget=-5", r"run.total_token_budget=-5 must be >= 0"),
    ("optim.agg=sum", "optim.agg='sum' must be one of 'token-mean', 'seq-mean-token-mean'"),
    ("allocation.rollouts_per_prompt=1", "rollouts_per_prompt=1 must be >= 2"),
    ("allocation.num_prompts=0", "num_prompts=0 must be >= 1"),
    ("predictor.name=oracle", "the oracle exists only in the simulator"),
    ("run.num_steps=0", "run.num_steps=0 must be >= 1"),
    ("sampling.temperature=0", "sampling.temperature=0.0 must be > 0"),
    ("run.nm_steps=3", r"run: unknown key\(s\) \['nm_steps'\]"),
    ("policy.engine=sglang", "policy.engine='sglang' must be one of 'transformers', 'vllm', 'openai'"),
    ("policy.vllm_kv_cache_gib=0", "policy.vllm_kv_cache_gib=0"),
    ("policy.engine=openai", "needs policy.base_url=http://host:port"),
    ("policy.lora_rank=-1", r"policy.lora_rank=-1 must be >= 0"),
    ("policy.lora_alpha=0", "policy.lora_alpha=0.0 must be > 0"),
    ("policy.lora_dropout=1", r"policy.lora_dropout=1.0 must be in \[0, 1\)"),
    ("policy.lora_target_modules=[]", "must name at least one module"),
    ("policy.lora_target_modules=q_proj", r"policy.lora_target_modules: expected a list, got 'q_proj'"),
    ("policy.device=tpu", "policy.device='tpu'; use cpu, cuda, cuda:N or auto"),
    # every numeric field has a range, checked at load, the key and the range in the message
    ("optim.lr=Infinity", "optim.lr=inf must be a finite number > 0"),
    ("optim.lr=NaN", "optim.lr=nan must be a finite number > 0"),
    ("optim.clip_eps=-0.1", r"optim.clip_eps=-0.1 must be in \[0, 1\)"),
    ("optim.clip_eps_high=-1", "optim.clip_eps_high=-1.0 must be >= 0"),
    ("optim.betas=[0.9, 1.0]", r"optim.betas=\(0.9, 1.0\) must be in \[0, 1\)"),
    ("optim.betas=[-0.1, 0.9]", r"optim.betas=\(-0.1, 0.9\) must be in \[0, 1\)"),
    ("run.seed=-1", "run.seed=-1 must be >= 0"),
    ("sampling.top_p=1.5", r"sampling.top_p=1.5 must be in \(0, 1\]"),
    ("allocation.root_share=0", r"allocation.root_share=0.0 must be in \(0, 1\]"),
    ("allocation.m_min=1", "allocation.m_min=1 must be >= 2"),
    ("allocation.continuation_cost=Infinity", "allocation.continuation_cost=inf must be a finite number > 0"),
    ("allocation.budget_unit=bytes", "allocation.budget_unit='bytes' must be one of 'units', 'tokens'"),
    ("advantages.eps=-1", "advantages.eps=-1.0 must be >= 0"),
    ("run.eval_steps=[0]", r"run.eval_steps=\(0,\) must be >= 1"),
    ("run.eval_steps=[12,30]",
     r"run.eval_steps=\[12, 30\]: \[30\] after run.num_steps=24; drop them or raise num_steps"),
])
def test_bad_configs_fail_at_load(override, message):
    with pytest.raises(ValueError, match=message):
        load_config(None, [override])


def test_the_vllm_engine_without_vllm_fails_at_load_with_the_install(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(ValueError, match=r"policy.engine='vllm' needs vLLM .*pip install -e '.\[vllm\]'"):
        load_config(None, ["policy.engine=vllm"])


def test_cli_reports_config_errors_without_a_traceback(capsys):
    from tracerl.cli import main

    assert main(["train", "--set", "optim.lr=fast"]) == 2
    assert "optim.lr: expected a number, got 'fast'" in capsys.readouterr().err


def test_a_run_directory_is_never_overwritten_and_resume_keeps_the_config(tmp_path):
    import json

    from tracerl.train.trainer import _check_run_dir, run_training

    config = load_config(None, [f"run.out_dir={tmp_path}"])
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match="already holds a run; pass --resume"):
        run_training(config)
    (tmp_path / "config.json").write_text(json.dumps(load_config(None, ["optim.lr=0.1"]).to_dict()))
    with pytest.raises(ValueError, match=r"differs from .*config.json in \['optim.lr'\]"):
        run_training(config, resume=True)
    # a run folder copied from elsewhere (its saved out_dir names the old place) resumes where it now is
    (tmp_path / "config.json").write_text(json.dumps(load_config(None, ["run.out_dir=/elsewhere/run"]).to_dict()))
    _check_run_dir(config, resume=True)


def test_a_hub_id_passes_the_config_and_fails_clearly_when_it_cannot_be_loaded(monkeypatch, tmp_path):
    from tracerl.train.policy import load_policy

    import huggingface_hub.constants

    # as on a machine without the hub: nothing cached, nothing reachable. The hub library reads HF_HUB_OFFLINE and its
    # cache folder once, when first imported, so its constants are set here, not the variables (with the library
    # imported before, the load would wait on the network: about 50 s here)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    config = load_config(None, ["policy.model=Qwen/Qwen3-0.6B", "data.domain=funcall"])
    with pytest.raises(ValueError, match="(?s)could not load policy.model='Qwen/Qwen3-0.6B'.*pass a local model"):
        load_policy(config)


def test_lora_without_peft_names_the_install(monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else find_spec(name, *a))
    with pytest.raises(ValueError, match=r"policy.lora_rank=8 needs peft: pip install -e '.\[lora\]'"):
        load_config(None, ["policy.lora_rank=8"])
    assert load_config(None, ["policy.lora_rank=0"]).policy.lora_rank == 0, "full fine-tuning needs no peft"


def test_cuda_without_a_gpu_fails_at_load_and_a_resume_may_change_the_device(monkeypatch, tmp_path):
    import json

    import torch

    from tracerl.train.trainer import _check_run_dir

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"policy.device='cuda' but torch .* sees no CUDA device; set policy.device="
                                         r"cpu \(or auto\)"):
        load_config(None, ["policy.device=cuda"])
    config = load_config(None, [f"run.out_dir={tmp_path}", "policy.device=auto"])
    saved = config.to_dict()
    saved["policy"]["device"] = "cuda"  # as written by a run on a GPU machine
    (tmp_path / "config.json").write_text(json.dumps(saved))
    _check_run_dir(config, resume=True)  # does not raise: a GPU run may continue on a CPU


def test_a_saved_config_parses_on_a_machine_that_cannot_run_it(monkeypatch):
    """Schema checks are separate from machine checks: Ray, CUDA, peft and the model are checked only to run."""
    from tracerl.io.files.config import from_dict
    from tracerl.train import config as config_module

    monkeypatch.setattr(config_module, "_has_ray", lambda: False)
    saved = load_config(None, ["policy.engine=openai", "policy.base_url=http://127.0.0.1:8000", "run.executor=ray",
                               "policy.device=cuda:3", "policy.model=/no/such/model", "data.domain=math"],
                        machine=False)
    again = from_dict(config_module.TrainConfig, saved.to_dict(), where="")
    assert again == saved and again.policy.device == "cuda:3"
    with pytest.raises(ValueError, match="needs Ray"):
        again.check_machine()


def test_tracerl_config_lists_every_field(capsys):
    import dataclasses

    from tracerl.cli import main
    from tracerl.train.config import TrainConfig

    assert main(["config"]) == 0
    out = capsys.readouterr().out

    def leaves(config, prefix=""):  # every field at any depth (policy.embedded is a section inside a section)
        for f in dataclasses.fields(config):
            value = getattr(config, f.name)
            yield from leaves(value, f"{prefix}{f.name}.") if dataclasses.is_dataclass(value) else [prefix + f.name]

    keys = list(leaves(TrainConfig()))
    assert "policy.embedded.sft_steps" in keys and "run.seed" in keys
    for key in keys:
        assert f"\n{key} " in "\n" + out, f"{key} is missing from `tracerl config`"
    assert "allocation.num_prompts  int = 16  (>= 1)" in out, "a section's default is the run's, not its class's"
    assert "AdamW learning rate" in out
