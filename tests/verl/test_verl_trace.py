"""TRACE on verl V1's real data path, on CPU: manager -> workers -> TransferQueue -> replay buffer -> padding ->
advantage step, with verl's own code at every step tracerl does not own.

Real: Ray (loopback only, checked), TransferQueue, `TraceAgentLoopManager.create` with its Ray worker actor,
`PPOTrainer._submit_batch_to_rollout`, `ReplayBuffer.sample`, `PPOTrainer._balance_batch` (which pads with
`upsample_batch_to_divisible_size`), `PPOTrainer._compute_old_log_prob` (in verl's bypass mode: old log-probs are the
rollout's), `PPOTrainer._compute_advantage` (verl's estimator registry and its GRPO).
The trainer methods are called unbound on a stub holding only what they read, as verl's own *_on_cpu tests do.
Stand-ins: the LLM server is `EngineLLMClient` over tracerl's scripted expert engine (noisy, so trees are mixed);
the tiny random Qwen3 saved on disk is what verl's worker loads its tokenizer and model config from.
verl's FSDP actor update, its weight sync and the whole trainer run in test_verl_main_ppo.py; vLLM/SGLang servers
are not covered (docs/verl.md).
"""

import asyncio
import os
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("verl.trainer.ppo.v1", reason="needs verl 0.9.1 in its own environment: run .ci/verl")

import ray  # noqa: E402
import torch  # noqa: E402
import transfer_queue as tq  # noqa: E402
import verl  # noqa: E402
from helpers import expert_engine  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer  # noqa: E402
from verl.trainer.ppo.v1.trainer_base import PPOTrainer  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402

from tracerl.core.advantages import compute_advantages  # noqa: E402
from tracerl.core.features import NUM_STRUCTURAL  # noqa: E402
from tracerl.core.tree import Tree  # noqa: E402
from tracerl.engines.transformers_engine import TransformersEngine  # noqa: E402
from tracerl.integrations.verl import EngineLLMClient, TraceAgentLoopManager, VerlEngine  # noqa: E402
from tracerl.io.rollout.engine import SamplingParams  # noqa: E402

N = 4  # rollout.n: the budget is BATCH * N trajectory units, as GRPO would spend
BATCH = 8
MINI = 2  # actor ppo_mini_batch_size: verl pads the rows to a multiple of lcm(dp=2, MINI * N) = 8
# the allocation and predictor sections are tracerl's own configs nested in verl's `tracerl:` section
TRACE = ["+tracerl.domain=multihop", "+tracerl.allocation.m_min=4", "+tracerl.allocation.m_max=6",
         "+tracerl.max_turns=6", "+tracerl.max_tokens_per_turn=128", "+tracerl.timeout_s=3"]


def verl_config(model_path: str, *overrides: str):
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose("ppo_trainer", overrides=[
            f"actor_rollout_ref.model.path={model_path}", "actor_rollout_ref.rollout.name=vllm",
            f"actor_rollout_ref.rollout.n={N}", "actor_rollout_ref.rollout.prompt_length=512",
            "actor_rollout_ref.rollout.response_length=4096", "actor_rollout_ref.rollout.agent.num_workers=1",
            "actor_rollout_ref.rollout.calculate_log_probs=true",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={MINI}", f"data.train_batch_size={BATCH}",
            "+actor_rollout_ref.rollout.agent.agent_loop_manager_class="
            "tracerl.integrations.verl.TraceAgentLoopManager", "algorithm.use_kl_in_reward=false",
            # old_log_probs = rollout_log_probs (verl's bypass mode): the one setting under which the trainer's
            # `_compute_old_log_prob` needs no actor worker, so it runs for real here
            "algorithm.rollout_correction.bypass_mode=true", *overrides])


class FlakyClient(EngineLLMClient):
    """The verl-style client over a tracerl engine, except that requests of the trees in `broken` raise (a replica
    went down) and those in `slow` never answer within the worker's timeout."""

    def __init__(self, engine, broken=(), slow=()):
        super().__init__(engine)
        self.broken, self.slow = set(broken), set(slow)

    async def generate(self, request_id, **kwargs):
        if request_id in self.broken:
            raise ConnectionError("replica unreachable")
        if request_id in self.slow:
            await asyncio.sleep(30)
        return await super().generate(request_id, **kwargs)


def make_batch(rows):
    """A verl batch as `_fetch_one_gen_batch` builds it from RLHFDataset columns (uids without '_')."""
    def column(values):
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out

    batch = tu.get_tensordict({
        "raw_prompt": column([r["prompt"] for r in rows]), "data_source": column([r["data_source"] for r in rows]),
        "reward_model": column([r["reward_model"] for r in rows]),
        "extra_info": column([r["extra_info"] for r in rows]),
        "index": np.arange(len(rows)), "uid": column([uuid.uuid4().hex for _ in rows])})
    tu.assign_non_tensor_data(batch, "global_steps", 1)
    return batch


def run_step(manager, batch, config, tokenizer):
    """Submit through the trainer's method, sample through the replay buffer, pad and compute advantages."""
    submitter = SimpleNamespace(trainer_mode="sync", global_steps=1, agent_loop_manager=manager)
    assert PPOTrainer._submit_batch_to_rollout(submitter, batch) == BATCH
    uids = list(batch["uid"])
    tags = tq.kv_list()["train"]
    assert all(tags[u].get("is_prompt") for u in uids), "every prompt is registered in TransferQueue"
    buffer = ReplayBuffer("sync", config.trainer, None, "drop", {}, poll_interval=0.2)
    with ThreadPoolExecutor(1) as pool:  # a hung rollout must fail the test, not hang it
        sampled, _ = pool.submit(buffer.sample, global_steps=1, partition_id="train", batch_size=BATCH).result(300)
    trainer = SimpleNamespace(config=config, actor_rollout_wg=SimpleNamespace(_dispatch_info={"actor": [0, 1]}),
                              tokenizer=tokenizer, use_critic=False, global_steps=1)
    trainer._get_required_batch_multiple = lambda dp: PPOTrainer._get_required_batch_multiple(trainer, dp)
    padded = PPOTrainer._balance_batch(trainer, sampled, metrics={})
    padded = PPOTrainer._compute_old_log_prob(trainer, padded, metrics={})
    padded = PPOTrainer._compute_advantage(trainer, padded, metrics={})
    fields = ["advantages", "response_mask", "rm_scores", "responses", "prompts", "input_ids", "rollout_log_probs"]
    data = tq.kv_batch_get(keys=padded.keys, partition_id="train", select_fields=fields)
    rows = {name: list(data[name].unbind(0)) for name in fields}
    trees = {u: Tree.from_dict(t) for u, t in ray.get(manager.coordinator.trees.remote()).items()}
    return sampled, padded, rows, trees


def expected_tokens(tree: Tree, leaf: int, per_segment) -> tuple[list[int], list[float]]:
    """The rollout's response ids and each token's value (per segment, 0 on observation tokens)."""
    ids, values = [], []
    for node_id, value in zip(tree.path(leaf)[1:], per_segment):
        seg = tree.nodes[node_id].segment
        ids += seg.token_ids
        values += [float(value) if m else 0.0 for m in seg.mask]
    return ids, values


@pytest.fixture(scope="module")
def trace_step(cluster, tiny):
    config = verl_config(tiny["path"], "algorithm.adv_estimator=tracerl_tree", *TRACE)
    batch = make_batch(tiny["rows"])
    uids = list(batch["uid"])
    client = FlakyClient(expert_engine(tiny["renderer"], tiny["rows"], tiny["domain"], noise=0.15),
                         broken=[uids[0]], slow=[uids[1]])
    manager = TraceAgentLoopManager.create(config=config, llm_client=client)
    sampled, padded, rows, trees = run_step(manager, batch, config, tiny["renderer"].tokenizer)
    stats = ray.get(manager.coordinator.stats.remote())
    return SimpleNamespace(config=config, uids=uids, manager=manager, plan=manager.last_plan, sampled=sampled,
                           padded=padded, rows=rows, trees=trees, stats=stats)


def test_ray_and_transferqueue_listen_on_loopback_only(cluster, trace_step):
    opened = cluster["listeners"]() - cluster["before"]
    assert opened, "Ray and TransferQueue are up, so something must listen"
    outside = sorted(a for a in opened if a[0] not in ("127.0.0.1", "::1", "::ffff:127.0.0.1"))
    assert not outside, f"listening beyond loopback: {outside}"


def test_rows_per_uid_equal_tracerl_allocation_zeros_included(trace_step):
    s = trace_step
    counts = dict(zip(s.uids, s.plan.counts.tolist()))
    assert 0 in counts.values() and sum(counts.values()) > 0, f"need filtered and granted prompts: {counts}"
    assert s.plan.counts.sum() + s.plan.prefix_budget.sum() <= BATCH * N, "stage 1 + stage 2 within B = batch * n"
    keys_per_uid = {u: [k for k in s.sampled.keys if k.split("_")[0] == u] for u in s.uids}
    for uid, m in counts.items():
        keys = keys_per_uid[uid]
        if m == 0:
            assert not keys and uid not in s.trees, f"prompt {uid} got no budget but has rows {keys}"
            continue
        tree = s.trees[uid]
        granted = m + sum(n.num_granted for n in tree.nodes[1:])
        assert tree.root.num_granted == m
        assert len(tree.leaves()) == granted == len(keys), \
            f"{uid}: {len(keys)} rows, {len(tree.leaves())} leaves, {granted} rollouts granted by stages 1 and 2"
        assert sorted(keys) == sorted(f"{uid}_{j}_0" for j in range(granted))
    assert any(n.origin == "continuation" for t in s.trees.values() for n in t.nodes), "stage 2 must have branched"


def test_shapes_masks_and_padding_rows_carry_no_loss(trace_step):
    s, rows = trace_step, trace_step.rows
    assert len(s.padded) % (MINI * N) == 0 and len(s.padded) > len(s.sampled)
    for i, (key, tag) in enumerate(zip(s.padded.keys, s.padded.tags)):
        prompts, responses, mask = rows["prompts"][i], rows["responses"][i], rows["response_mask"][i]
        assert len(prompts) + len(responses) == len(rows["input_ids"][i])
        assert len(responses) == len(mask) == len(rows["rm_scores"][i]) == len(rows["rollout_log_probs"][i]) \
            == len(rows["advantages"][i])
        if key.startswith("pad"):
            assert tag.get("is_padding") and not mask.any() and not rows["advantages"][i].any(), key
            continue
        uid, j, _ = key.split("_")
        tree = s.trees[uid]
        leaf = tree.leaves()[int(j)]
        ids, policy = expected_tokens(tree, leaf, [1.0] * tree.nodes[leaf].depth)
        if ids:  # a failed bare rollout has one filler token with mask 0
            assert responses.tolist() == ids, f"{key}: responses are not the rollout's exact token ids"
            assert mask.tolist() == [int(v) for v in policy], f"{key}: response_mask must be 0 on observations"
        else:
            assert len(responses) == 1 and not mask.any()
        assert prompts.tolist() == tree.root.segment.token_ids, f"{key}: prompt ids differ from the tree's root"


def test_verl_advantages_equal_tracerl_tree_advantages_exactly(trace_step):
    s, rows = trace_step, trace_step.rows
    expected = {u: compute_advantages("trace", [t])[0] for u, t in s.trees.items()}
    nonzero = 0
    for i, key in enumerate(s.padded.keys):
        if key.startswith("pad"):
            continue
        uid, j, _ = key.split("_")
        tree = s.trees[uid]
        leaf = tree.leaves()[int(j)]
        _, want = expected_tokens(tree, leaf, expected[uid].of(leaf))
        got = rows["advantages"][i]
        if not want:
            want = [0.0]
        assert torch.equal(got, torch.tensor(want, dtype=torch.float32)), f"{key}: verl's advantages differ"
        assert not got[rows["response_mask"][i] == 0].any()
        nonzero += int(got.ne(0).any())
    assert nonzero > 0, "the noisy expert must produce mixed trees, so some advantages are non-zero"


def test_failed_and_timed_out_rollouts_are_failed_leaves_and_counted(trace_step):
    s = trace_step
    broken, slow = s.uids[0], s.uids[1]
    counts = dict(zip(s.uids, s.plan.counts.tolist()))
    assert counts[broken] > 0 and counts[slow] > 0, "the failing prompts must have been granted rollouts"
    for uid in (broken, slow):
        tree = s.trees[uid]
        assert [tree.nodes[i].finish_reason for i in tree.leaves()] == ["error"] * counts[uid]
        assert all(tree.nodes[i].reward == 0.0 for i in tree.leaves())
    c = s.stats["counters"]
    assert c.get("rollout/engine_errors", 0) >= 1 and c.get("rollout/engine_timeouts", 0) >= 1, c
    assert c.get("rollout/failed_rollouts", 0) >= counts[broken] + counts[slow], c


def test_predictor_is_updated_from_the_step_trees_and_the_spend_is_logged(trace_step):
    s = trace_step
    manager = s.manager
    planned = manager.last_metrics
    assert planned["alloc/planned_units_root"] == s.plan.counts.sum()
    assert planned["alloc/planned_units_prefix"] == s.plan.prefix_budget.sum()
    before = ray.get(manager.coordinator.stats.remote())["num_updates"]
    metrics = ray.get(manager.coordinator.flush.remote())
    assert ray.get(manager.coordinator.stats.remote())["num_updates"] == before + 1
    assert metrics["predictor/num_trees"] == len(s.trees) and "predictor/brier" in metrics
    # what was spent, from the trees: every granted fresh rollout (failed ones too) 1 unit, a continuation 0.5
    continuations = sum(t.nodes[i].anchor_id != 0 for t in s.trees.values() for i in t.leaves())
    assert metrics["alloc/units_root"] == s.plan.counts.sum()
    assert metrics["alloc/units_prefix"] == 0.5 * continuations <= planned["alloc/planned_units_prefix"]
    policy_tokens = sum(sum(n.segment.mask) for t in s.trees.values() for n in t.nodes)
    assert metrics["alloc/tokens_root"] + metrics["alloc/tokens_prefix"] == policy_tokens == metrics["rollout/tokens"]
    mixed = sum(t.is_mixed() for t in s.trees.values())
    assert metrics["alloc/effective_ratio"] == mixed / len(s.trees)
    assert 0 < metrics["alloc/informative_rollout_frac"] <= 1


def test_the_coordinator_predictor_reads_the_domain_state_features(trace_step, tiny):
    """The coordinator is a Ray actor in a process of its own: it builds the run's domain there and hands the domain's
    state features to its predictor, as the trainer does, so multihop histories fill the predictor's state columns."""
    histories = [t.history(n.node_id) for t in trace_step.trees.values() for n in t.nodes if not n.is_leaf]
    named = [any(v != 0 for v in tiny["domain"].state_features(h).values()) for h in histories]
    assert any(named), "multihop names the state of the step's histories"

    def state_columns(coordinator, histories):  # runs inside the actor, on its predictor
        features = coordinator.predictor.features
        return features.transform(histories).to_dense()[:, features.num_buckets + NUM_STRUCTURAL:]

    block = ray.get(trace_step.manager.coordinator.__ray_call__.remote(state_columns, histories))
    assert block.shape == (len(histories), 4096), "the predictor section's hashed_logistic has its state block"
    assert [bool(row.any()) for row in block] == named, "every history with named state fills its state columns"


def test_star_tree_verl_grpo_equals_tracerl_grpo(cluster, tiny):
    """Stage 1 only (star trees), rewards in rm_scores and verl's own GRPO estimator against tracerl's `grpo`."""
    config = verl_config(tiny["path"], "algorithm.adv_estimator=grpo", *TRACE, "+tracerl.rm_scores=reward",
                         "+tracerl.method=trace-root-only")
    client = EngineLLMClient(expert_engine(tiny["renderer"], tiny["rows"], tiny["domain"], noise=0.15))
    manager = TraceAgentLoopManager.create(config=config, llm_client=client)
    _, padded, rows, trees = run_step(manager, make_batch(tiny["rows"]), config, tiny["renderer"].tokenizer)
    assert all(n.origin != "continuation" for t in trees.values() for n in t.nodes), "star trees only"
    expected = {u: compute_advantages("grpo", [t])[0] for u, t in trees.items()}
    mixed = 0
    for i, key in enumerate(padded.keys):
        if key.startswith("pad"):
            continue
        uid, j, _ = key.split("_")
        tree = trees[uid]
        leaf = tree.leaves()[int(j)]
        _, want = expected_tokens(tree, leaf, expected[uid].of(leaf))
        reward = rows["rm_scores"][i]
        assert reward[-1].item() == tree.nodes[leaf].reward and not reward[:-1].any(), "reward on the last token"
        torch.testing.assert_close(rows["advantages"][i], torch.tensor(want, dtype=torch.float32), atol=1e-6, rtol=0)
        mixed += tree.is_mixed()
    assert mixed > 0, "some groups must have reward contrast"


def test_verl_engine_round_trip_matches_the_transformers_engine(tiny):
    """tracerl engine -> verl client -> VerlEngine gives what the engine gives directly (greedy, tiny Qwen3)."""
    engine = TransformersEngine(tiny["model"])
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        client = EngineLLMClient(engine)
        adapter = VerlEngine(client, loop, "tree-1", timeout_s=60)
        stop = tiny["renderer"].stop_token_ids
        params = SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=stop)
        prefixes = [tiny["renderer"].encode("What is the alma mater"), tiny["renderer"].encode("Who mentors")]
        got = adapter.generate(prefixes, params, [2, 1])
        want = TransformersEngine(tiny["model"]).generate(prefixes, params, [2, 1])
        assert [len(g) for g in got] == [2, 1]
        for g_list, w_list in zip(got, want):
            for g, w in zip(g_list, w_list):
                assert g.token_ids == w.token_ids and g.finish_reason == w.finish_reason
                np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-5)
        assert client.requests == {"tree-1": 3}, "every sample of a tree carries the tree's id"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def test_manager_refuses_verls_own_numbers_in_the_allocation_section(tiny):
    """Checked in the manager's constructor, before any worker actor starts (no Ray needed)."""
    config = verl_config(tiny["path"], "algorithm.adv_estimator=tracerl_tree", *TRACE,
                         "+tracerl.allocation.rollouts_per_prompt=8")
    with pytest.raises(ValueError, match="rollouts_per_prompt is set by verl's actor_rollout_ref.rollout.n"):
        TraceAgentLoopManager(config, llm_client=None)
