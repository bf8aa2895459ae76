"""The pieces of `tracerl.integrations.verl_plugin` on their own: the version and source checks that guard the
patches, the CPU device module, the `tracerl_hf` server's weight load and generation, the trainer mode, and the
`tracerl.domain_options` a run's world is built with. `test_verl_main_ppo.py` runs them together in verl's trainer."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("verl.trainer.ppo.v1", reason="needs verl 0.9.1 in its own environment: run .ci/verl")

import asyncio  # noqa: E402

import torch  # noqa: E402
import verl  # noqa: E402

from tracerl.integrations.verl import TraceVerlConfig  # noqa: E402
from tracerl.integrations.verl_plugin import VERL_VERSION, VerlMoved, checks, cpu, environment  # noqa: E402
from tracerl.io.rollout.engine import SamplingParams  # noqa: E402


def test_another_verl_version_is_refused_naming_the_one_to_install(monkeypatch):
    monkeypatch.setattr(verl, "__version__", "0.10.0")
    with pytest.raises(VerlMoved, match=rf"verl 0.10.0.*verl\[verl-core\]=={VERL_VERSION}"):
        checks.check_version()


def test_a_patch_whose_verl_line_moved_is_refused():
    def moved():
        return "some other code"

    with pytest.raises(VerlMoved, match="expects 'cpu:gloo,' in verl's source"):
        checks.check_source(moved, "cpu:gloo,", "a moved function")


def test_the_patched_lines_are_the_installed_verls():
    """The needles the patches look for are in this verl (the same checks `install` runs)."""
    import verl.utils.distributed as distributed
    from verl.workers.engine.base import EngineRegistry

    original = distributed.initialize_global_process_group_ray
    assert not getattr(original, "_tracerl_cpu", False), "this process did not load the plugin: verl's own line"
    checks.check_source(original, 'f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"', "distributed")
    checks.check_source(EngineRegistry.get_engine_cls.__func__, 'os.getenv("VERL_ENGINE_DEVICE")', "engine")
    # vllm_cpu's weight-sync patch: its module imports vLLM, which this environment lacks, so read it as text
    from pathlib import Path

    worker = (Path(verl.__file__).parent / "workers/rollout/vllm_rollout/utils.py").read_text()
    assert "def _update_weights(" in worker and "model.load_weights(param_updates)" in worker


def test_the_platform_answers_what_verl_asks_of_a_device():
    platform = cpu.register_platform()()
    device = platform.device_module
    assert platform.device_name == "cpu" and platform.communication_backend_name() == "gloo"
    assert torch.zeros(1).to(platform.current_device()).device.type == "cpu"
    assert device.memory_allocated() == 0 and device.max_memory_reserved() == 0
    free, total = device.mem_get_info()
    assert 0 < free <= total
    state = device.get_rng_state()
    first = torch.rand(3)
    device.set_rng_state(state)
    assert torch.equal(first, torch.rand(3))


def test_every_verl_process_loads_the_hooks_and_verl_uses_the_cpu_platform():
    """A fresh interpreter with `environment()`: importing verl imports the plugin, which registers the platform,
    the rollout and the trainer mode, patches the process-group backend and points verl's engine lookup at FSDP's."""
    code = ("import verl\n"
            "from verl.plugin.platform.platform_manager import get_platform\n"
            "from verl.workers.rollout.replica import RolloutReplicaRegistry\n"
            "from verl.trainer.ppo.v1 import get_trainer_cls\n"
            "import verl.utils.distributed as d\n"
            "print(get_platform().device_name, RolloutReplicaRegistry.get('tracerl_hf').__name__,"
            " get_trainer_cls('tracerl_sync').__name__, getattr(d.initialize_global_process_group_ray,"
            " '_tracerl_cpu', False), __import__('os').environ.get('VERL_ENGINE_DEVICE'))\n")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **environment()}, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-5:] == ["cpu", "TransformersReplica", "TraceTrainerSync", "True", "cuda"]


@pytest.fixture(scope="module")
def server(tiny):
    from tracerl.integrations.verl_plugin.rollout import TransformersServer

    return TransformersServer(tiny["path"], replica_rank=0)


def test_the_server_loads_the_actors_weights_in_place_tied_head_included(server, tiny):
    state = {k: v + 0.01 for k, v in tiny["model"].state_dict().items()}
    count = asyncio.run(server.load_weights(sorted(state.items()), global_steps=3))
    assert count == len(state)
    served = asyncio.run(server.state())
    assert served["weight_syncs"] == 1 and served["global_steps"] == 3
    assert all(torch.equal(served["weights"][k], v) for k, v in state.items())


def test_the_server_refuses_weights_its_model_does_not_have(server):
    with pytest.raises(KeyError, match="rollout model does not have.*not_a_layer"):
        asyncio.run(server.load_weights([("not_a_layer.weight", torch.zeros(2))], global_steps=4))


def test_the_server_generates_with_one_logprob_per_token(server, tiny):
    prompt = tiny["renderer"].tokenizer(tiny["rows"][0]["prompt"][-1]["content"])["input_ids"]
    out = asyncio.run(server.generate("tree-1", prompt_ids=list(prompt),
                                      sampling_params={"temperature": 1.0, "max_tokens": 8, "seed": 1}))
    assert 1 <= len(out.token_ids) <= 8 and len(out.log_probs) == len(out.token_ids)
    assert all(lp <= 0 for lp in out.log_probs)
    with pytest.raises(ValueError, match="text models only"):
        asyncio.run(server.generate("tree-1", prompt_ids=list(prompt), sampling_params={}, image_data=[b"x"]))


def test_domain_options_build_the_workers_world_and_a_bad_one_names_the_key():
    section = {"domain": "multihop", "domain_options": {"num_entities": 40, "num_distractors": 0, "hops": [2, 2]}}
    assert TraceVerlConfig.from_mapping(section, num_prompts=8, rollout_n=4).domain_options["num_entities"] == 40
    with pytest.raises(ValueError, match="tracerl: domain_options for domain 'multihop'.*no_such_option"):
        TraceVerlConfig.from_mapping({"domain_options": {"no_such_option": 1}}, num_prompts=8, rollout_n=4)


def test_sampling_params_match_the_engines():
    """The server builds tracerl's SamplingParams from verl's dict: a field renamed in one breaks here."""
    assert {"temperature", "top_p", "max_tokens", "stop_token_ids", "seed"} <= set(SamplingParams.__dataclass_fields__)
