"""The ReAct tree driver with a scripted engine over the real multi-hop domain and a trained tokenizer."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("transformers")

from tracerl.core.growth import grow_trees  # noqa: E402
from tracerl.core.ledger import make_prices  # noqa: E402
from tracerl.core.methods import AllocationConfig, get_method  # noqa: E402
from tracerl.io.domains.funcall import FuncallDomain, FuncallEnv  # noqa: E402
from tracerl.io.domains.multihop import MultiHopDomain  # noqa: E402
from tracerl.io.rollout.driver import DriverLimits, ReActDriver  # noqa: E402
from tracerl.io.rollout.scripted_engine import ScriptedEngine  # noqa: E402

from helpers import expert_engine, make_renderer  # noqa: E402

DOMAIN = MultiHopDomain(num_entities=80, num_distractors=20, seed=0)
ROWS = DOMAIN.rows("test", 24, seed=0)
FUNCALL = FuncallDomain()
FUNCALL_ROWS = [r for r in FUNCALL.rows("test", 40, seed=0) if len(r["reward_model"]["ground_truth"]["calls"]) >= 2][:8]


@pytest.fixture(scope="module")
def renderer():
    texts = [d["title"] + " " + d["text"] for d in DOMAIN.kb.documents] + [r["prompt"][-1]["content"] for r in ROWS]
    return make_renderer(texts + [r["prompt"][-1]["content"] for r in FUNCALL_ROWS])


def bfcl_domain_and_rows():
    pytest.importorskip("bfcl_eval", reason='BFCL needs: pip install --no-deps "bfcl-eval==2026.3.23"')
    from tracerl.io.domains.bfcl import BfclDomain
    domain = BfclDomain()
    return domain, domain.rows("test", 12, seed=0)


DOMAINS = {"multihop": lambda: (DOMAIN, ROWS), "funcall": lambda: (FUNCALL, FUNCALL.rows("test", 24, seed=0)),
           "bfcl": bfcl_domain_and_rows}


@pytest.mark.parametrize("name", sorted(DOMAINS))
def test_expert_solves_the_test_split_through_the_driver(renderer, name):
    domain, rows = DOMAINS[name]()
    driver = ReActDriver(expert_engine(renderer, rows, domain=domain), renderer, domain,
                         limits=DriverLimits(max_turns=24, max_tokens_per_turn=512, max_tokens_per_rollout=60_000,
                                             max_observation_chars=100_000))
    driver.set_rows(rows)
    trees, num_tokens = driver.run_roots(list(range(len(rows))), [2] * len(rows))
    rewards = np.concatenate([t.rewards() for t in trees])
    assert len(rewards) == 2 * len(rows) and num_tokens > 0
    assert rewards.mean() >= 0.95, (name, dict(driver.counters))
    for tree in trees:
        for leaf in tree.leaves():
            segment = tree.nodes[leaf].segment
            assert segment.mask and all(segment.mask), "a final turn holds policy tokens only"
        for node in tree.nodes[1:]:
            mask = node.segment.mask
            assert mask[0] == 1 and mask == sorted(mask, reverse=True), "policy tokens first, then observation"


def continue_from_first_turn(renderer):
    """Expert rollouts on multi-call tasks, then expert continuations from each tree's first-turn node."""
    engine = expert_engine(renderer, FUNCALL_ROWS, FUNCALL)
    driver = ReActDriver(engine, renderer, FUNCALL, limits=DriverLimits(max_turns=8))
    driver.set_rows(FUNCALL_ROWS)
    trees, _ = driver.run_roots(list(range(len(FUNCALL_ROWS))), [1] * len(FUNCALL_ROWS))
    anchors = [(t, t.children[0][0], 2) for t in trees]
    num_calls = len(engine.calls)
    driver.run_continuations(anchors)
    return engine.calls[num_calls][0], anchors


def test_continuations_resume_the_exact_prefix_and_environment_state(renderer):
    prefixes, anchors = continue_from_first_turn(renderer)
    for (tree, node_id, _), prefix in zip(anchors, prefixes):
        assert prefix == tree.prefix_token_ids(node_id), "a branch must start from the prefix's exact token ids"
        continuations = [c for c in tree.children[node_id] if tree.nodes[c].origin == "continuation"]
        assert len(continuations) == 2
        # the first call's effect on the APIs lives only in the restored environment state
        rewards = [tree.nodes[i].reward for c in continuations for i in tree.leaves_below(c)]
        assert rewards == [1.0, 1.0], f"{tree.prompt_id}: continuations did not resume the environment state"


def test_the_state_check_fails_when_the_environment_is_not_restored(renderer, monkeypatch):
    monkeypatch.setattr(FuncallEnv, "restore", lambda self, snapshot: None)
    _, anchors = continue_from_first_turn(renderer)
    rewards = [t.nodes[i].reward for t, node_id, _ in anchors for c in t.children[node_id][1:]
               for i in t.leaves_below(c)]
    assert np.mean(rewards) < 0.5


def test_a_whole_trace_step_runs_on_the_driver(renderer):
    driver = ReActDriver(expert_engine(renderer, ROWS, DOMAIN, noise=0.4), renderer, DOMAIN)
    pool = driver.set_rows(ROWS[:16])
    config = AllocationConfig(num_prompts=4, rollouts_per_prompt=4, pool_factor=4)
    prices = make_prices(config)
    ledger = prices.ledger()
    grown = grow_trees(get_method("trace"), config, pool, lambda hs: np.full(len(hs), 0.5), driver, ledger,
                       np.random.default_rng(0), prices)
    assert ledger.units_spent <= config.budget
    assert ledger.tokens_spent > 0 and grown.trees


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 60))
def test_random_model_output_never_raises(renderer, seed, length):
    vocab = len(renderer.tokenizer)

    def script(prefix, sample_index, rng):
        return [rng.randrange(vocab) for _ in range(rng.randrange(1, length + 1))] + [renderer.stop_token_ids[0]]

    driver = ReActDriver(ScriptedEngine(script, seed=seed), renderer, DOMAIN,
                         limits=DriverLimits(max_turns=4, max_tokens_per_turn=48, max_tokens_per_rollout=400))
    driver.set_rows(ROWS[:3])
    trees, _ = driver.run_roots([0, 1, 2], [2, 2, 2])
    assert sum(t.rewards().sum() for t in trees) <= 1, "random tokens should (almost) never answer correctly"
    for tree in trees:
        assert len(tree.leaves()) == 2
        assert all(tree.nodes[i].finish_reason in ("answer", "max_turns", "max_tokens", "error") for i in tree.leaves())
        assert all(tree.children[n.node_id] for n in tree.nodes if not n.is_leaf)
