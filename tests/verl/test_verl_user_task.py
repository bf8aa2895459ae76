"""A verl user's own task through the TRACE manager: a tool config YAML naming a `BaseTool` class, and a custom
reward function file, set by verl's own keys (`actor_rollout_ref.rollout.multi_turn.tool_config_path`,
`reward.custom_reward_function.path/name/reward_kwargs`); nothing of the task is named in the `tracerl:` section.

The task (`vault_task/`): look a vault's code up with the `vault_code` tool (its instance reads the row's
`extra_info.tools_kwargs.vault_code.create_kwargs`), then answer it; `reward.py:vault_score` scores the transcript.
Real as in test_verl_trace.py: Ray, TransferQueue, the manager and its worker actor, verl's replay buffer, padding
and advantage step. Stand-in: the LLM server is a scripted expert engine (noisy, so trees are mixed), over a tiny
random Qwen3 whose tokenizer is trained on this task's text.
"""

import os
import re
from types import SimpleNamespace

import pytest

pytest.importorskip("verl.trainer.ppo.v1", reason="needs verl 0.9.1 in its own environment: run .ci/verl")

import torch  # noqa: E402
from helpers import BUILD_SEED, expert_engine, make_renderer  # noqa: E402
from test_verl_trace import BATCH, MINI, N, expected_tokens, make_batch, run_step, verl_config  # noqa: E402

from tracerl.core.advantages import compute_advantages  # noqa: E402
from tracerl.integrations.verl import EngineLLMClient, TraceAgentLoopManager  # noqa: E402
from tracerl.integrations.verl.config import task_settings  # noqa: E402
from tracerl.io.env.task import json_call  # noqa: E402

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vault_task")
TOOL_CONFIG = os.path.join(HERE, "tool_config.yaml")
REWARD = os.path.join(HERE, "reward.py")
CODES = {"amber": "4417", "birch": "9023", "cobalt": "1186", "dune": "7350"}
USER_TASK = [f"actor_rollout_ref.rollout.multi_turn.tool_config_path={TOOL_CONFIG}",
             f"reward.custom_reward_function.path={REWARD}", "reward.custom_reward_function.name=vault_score",
             "+tracerl.allocation.m_min=4", "+tracerl.allocation.m_max=6", "+tracerl.max_turns=4",
             "+tracerl.max_tokens_per_turn=128", "+tracerl.timeout_s=30"]


def vault_rows():
    """8 rows in verl's layout; the owner travels to the tool through `tools_kwargs`."""
    rows = []
    for i, (vault, code) in enumerate(list(CODES.items()) * 2):
        owner = ["ada", "ben"][i // 4]
        rows.append({"data_source": "vaults", "prompt": [{"role": "user", "content":
                     f"{owner.title()} asks: which code opens vault {vault}? Use vault_code, then answer."}],
                     "reward_model": {"style": "rule", "ground_truth": code},
                     "extra_info": {"index": i, "vault": vault, "owner": owner,
                                    "tools_kwargs": {"vault_code": {"create_kwargs": {"owner": owner}}}}})
    return rows


def vault_expert(row, turns, rng):
    """Call the tool, then answer the code it showed."""
    if not turns:
        return json_call("vault_code", {"name": row["extra_info"]["vault"]})
    found = re.search(r"code (\d+)", turns[-1][1])
    return f"<answer>{found.group(1) if found else 'none'}</answer>"


@pytest.fixture(scope="module")
def vault(tmp_path_factory):
    from tracerl.engines.tiny import tiny_qwen3

    rows = vault_rows()
    texts = [r["prompt"][-1]["content"] for r in rows]
    texts += [f"vault {v} opened for {o}: code {c} <answer>{c}</answer>" for v, c in CODES.items() for o in "ab"]
    renderer = make_renderer(texts, vocab_size=600)
    model = tiny_qwen3(vocab_size=len(renderer.tokenizer), hidden_size=32, num_heads=2, num_kv_heads=1,
                       seed=BUILD_SEED)
    path = tmp_path_factory.mktemp("tiny-qwen3-vault")
    model.save_pretrained(path)
    renderer.tokenizer.save_pretrained(path)
    return {"rows": rows, "renderer": renderer, "path": str(path)}


@pytest.fixture(scope="module")
def vault_step(cluster, vault):
    config = verl_config(vault["path"], "algorithm.adv_estimator=tracerl_tree", *USER_TASK)
    engine = expert_engine(vault["renderer"], vault["rows"], SimpleNamespace(expert_turn=vault_expert), noise=0.2,
                           wrong="<answer>0000</answer>")
    manager = TraceAgentLoopManager.create(config=config, llm_client=EngineLLMClient(engine))
    batch = make_batch(vault["rows"])
    sampled, padded, rows, trees = run_step(manager, batch, config, vault["renderer"].tokenizer)
    return SimpleNamespace(uids=list(batch["uid"]), plan=manager.last_plan, sampled=sampled, padded=padded,
                           rows=rows, trees=trees, renderer=vault["renderer"], data=vault["rows"])


def test_verl_settings_are_read_from_verls_own_keys(vault):
    config = verl_config(vault["path"], *USER_TASK, "+reward.custom_reward_function.reward_kwargs.bonus=0.5")
    assert task_settings(config) == {"tool_config_path": TOOL_CONFIG, "function_tool_path": "", "reward_path": REWARD,
                                     "reward_name": "vault_score", "reward_kwargs": {"bonus": 0.5}}
    assert task_settings(verl_config(vault["path"]))["tool_config_path"] == ""
    functions = verl_config(vault["path"], "actor_rollout_ref.rollout.multi_turn.function_tool_path=/tools/fns.py")
    assert task_settings(functions)["function_tool_path"] == "/tools/fns.py", "verl's function tools key is read"


def test_rows_per_uid_equal_the_trees_leaves(vault_step):
    s = vault_step
    counts = dict(zip(s.uids, s.plan.counts.tolist()))
    assert s.plan.counts.sum() + s.plan.prefix_budget.sum() <= BATCH * N
    for uid, m in counts.items():
        keys = sorted(k for k in s.sampled.keys if k.split("_")[0] == uid)
        if m == 0:
            assert not keys and uid not in s.trees
            continue
        tree = s.trees[uid]
        granted = m + sum(n.num_granted for n in tree.nodes[1:])
        assert len(tree.leaves()) == granted == len(keys)
        assert keys == sorted(f"{uid}_{j}_0" for j in range(granted))
    assert any(n.origin == "continuation" for t in s.trees.values() for n in t.nodes), "stage 2 must have branched"


def test_the_users_tool_and_reward_ran_in_the_tree(vault_step):
    """Observations come from the VaultTool instance (with the row's create_kwargs), including in continuations
    resumed by replay; leaf rewards are vault_score's of the transcript."""
    s, by_uid = vault_step, dict(zip(vault_step.uids, vault_step.data))
    called = rewarded = 0
    for uid, tree in s.trees.items():
        row = by_uid[uid]
        vault, owner = row["extra_info"]["vault"], row["extra_info"]["owner"]
        for leaf in tree.leaves():
            if tree.nodes[leaf].finish_reason == "error":
                continue
            text = s.renderer.decode([t for n in tree.path(leaf)[1:] for t in tree.nodes[n].segment.token_ids])
            if f"vault {vault} opened for {owner}: code {CODES[vault]}" in text:
                called += 1
            answers = re.findall(r"<answer>(.*?)</answer>", text)
            want = float(bool(answers) and answers[-1] == CODES[vault])
            assert tree.nodes[leaf].reward == want, f"{uid} leaf {leaf}: reward is not vault_score's\n{text}"
            rewarded += want == 1.0
    assert called > 0 and rewarded > 0


def test_shapes_masks_and_advantages_equal_tracerls(vault_step):
    s, rows = vault_step, vault_step.rows
    assert len(s.padded) % (MINI * N) == 0
    expected = {u: compute_advantages("trace", [t])[0] for u, t in s.trees.items()}
    nonzero = 0
    for i, (key, tag) in enumerate(zip(s.padded.keys, s.padded.tags)):
        responses, mask, adv = rows["responses"][i], rows["response_mask"][i], rows["advantages"][i]
        assert len(responses) == len(mask) == len(adv) == len(rows["rm_scores"][i])
        if key.startswith("pad"):
            assert tag.get("is_padding") and not mask.any() and not adv.any(), key
            continue
        uid, j, _ = key.split("_")
        tree = s.trees[uid]
        leaf = tree.leaves()[int(j)]
        ids, policy = expected_tokens(tree, leaf, [1.0] * tree.nodes[leaf].depth)
        _, want = expected_tokens(tree, leaf, expected[uid].of(leaf))
        assert responses.tolist() == ids and mask.tolist() == [int(v) for v in policy], key
        assert rows["prompts"][i].tolist() == tree.root.segment.token_ids, key
        assert torch.equal(adv, torch.tensor(want, dtype=torch.float32)), f"{key}: verl's advantages differ"
        nonzero += int(adv.ne(0).any())
    assert nonzero > 0, "the noisy expert must produce mixed trees"


def test_manager_refuses_a_bad_reward_setting_at_start(vault):
    """Checked in the manager's constructor, before any worker actor starts (no Ray needed)."""
    config = verl_config(vault["path"], "algorithm.adv_estimator=tracerl_tree", *USER_TASK,
                         "reward.custom_reward_function.name=compute_score")
    with pytest.raises(ValueError, match=r"has no function 'compute_score' \(custom_reward_function.name\)"):
        TraceAgentLoopManager(config, llm_client=None)
    config = verl_config(vault["path"], "algorithm.adv_estimator=tracerl_tree", *USER_TASK,
                         "actor_rollout_ref.rollout.multi_turn.tool_config_path=/nonexistent/tools.yaml")
    with pytest.raises(ValueError, match="tool config /nonexistent/tools.yaml .* does not exist"):
        TraceAgentLoopManager(config, llm_client=None)
