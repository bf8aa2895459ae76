"""The embedded warm start for another domain than multihop: the function-calling suite on a deliberately small
config (cache key, expert traces in any order, digits split, the trainer's domain), and the config checks."""

import numpy as np
import pytest
from helpers import BUILD_SEED

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tracerl.io.domains import make_domain
from tracerl.io.domains.funcall import FuncallDomain
from tracerl.io.rollout.tokenizer import train_tokenizer
from tracerl.policy import embedded
from tracerl.policy.embedded import EmbeddedConfig, build_embedded, expert_episode, warmup_seed
from tracerl.train.config import load_config

SMALL = EmbeddedConfig(seed=BUILD_SEED, split_digits=True, max_turns=4, max_tokens_per_turn=48, num_train_rows=24,
                       p_noise_turn=0.2, vocab_size=400, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                       sft_steps=20,
                       batch_size=4, lr=1e-2, num_eval_prompts=4, eval_samples_per_prompt=2)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    return cache, build_embedded(SMALL, cache, domain=FuncallDomain())


def test_a_funcall_build_is_cached_under_the_domain_and_loads_with_it(built):
    cache, policy = built
    assert policy.path.parent == cache
    assert policy.path.name.startswith(f"{SMALL.key()}-funcall{embedded.DOMAIN_BUILD_VERSION}-")
    assert isinstance(policy.domain, FuncallDomain)
    metrics = policy.metrics()
    assert metrics["eval/num_prompts"] == SMALL.num_eval_prompts and 0.0 <= metrics["eval/success"] <= 1.0
    again = build_embedded(SMALL, cache, domain=FuncallDomain())  # a second call loads the same weights
    assert again.path == policy.path and again.weights_hash() == policy.weights_hash()


def test_the_warm_start_tokenizer_gives_every_digit_its_own_token(built):
    _, policy = built
    ids = policy.tokenizer.encode("Transfer 340 from alice to bob.")
    assert [policy.tokenizer.decode([i]) for i in ids if policy.tokenizer.decode([i]).strip().isdigit()] == \
        ["3", "4", "0"]
    merged = train_tokenizer(["amount 340 and 340 and 340"] * 20, vocab_size=300)
    assert any(len(merged.decode([i]).strip()) > 1 and merged.decode([i]).strip().isdigit()
               for i in merged.encode("340")), "without split_digits the digits merge (the test would not see it)"


def test_expert_traces_are_the_same_whatever_order_they_run_in():
    """A built-in domain's traces run side by side in threads; each has its own random stream, so the traces are
    those of running them one by one."""
    domain = FuncallDomain()
    rows = domain.rows("train", 40, seed=warmup_seed(0))
    config = EmbeddedConfig(p_noise_turn=0.3, max_turns=4)
    threaded = embedded._expert_episodes(domain, rows, config, own_world=False)
    one_by_one = [expert_episode(domain, rows[i], np.random.default_rng([0, 0, i]), 0.3, 4, rows)
                  for i in reversed(range(len(rows)))][::-1]
    assert [e.turns for e in threaded] == [e.turns for e in one_by_one]
    assert 0 < sum(e.num_noisy_turns for e in threaded), "no noisy turn: the comparison would not test the streams"


def test_warm_start_rows_are_drawn_apart_from_a_runs_seed():
    domain = FuncallDomain()
    warm = {r["prompt"][-1]["content"] for r in domain.rows("train", 200, seed=warmup_seed(0))}
    run = [r["prompt"][-1]["content"] for r in domain.rows("train", 200, seed=0)]
    assert sum(q in warm for q in run) < len(run), "the warm start drew the run's own question stream"


def test_the_trainer_builds_the_domain_with_its_options():
    config = load_config(None, ["data.domain=math", 'data.options={"mix": {"chain_sum": 1.0}}'])
    domain = config.domain_factory()()
    assert domain.name == "math" and domain.mix == {"chain_sum": 1.0}
    assert make_domain("math", mix={"chain_sum": 1.0}).fingerprint() == domain.fingerprint()
    assert make_domain("math").fingerprint() != domain.fingerprint()


@pytest.mark.parametrize("overrides, message", [
    (["data.domain=math", 'data.options={"mixx": {"chain_sum": 1.0}}'], "does not take"),
    (["data.domain=bfcl"], "does not learn BFCL"),
    (['data.options={"hops": [1, 2]}'], "policy.embedded"),
])
def test_domain_options_and_embedded_domains_are_checked_at_load(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config(None, overrides)


def test_a_template_mix_draws_only_its_templates_and_the_default_is_unchanged():
    from collections import Counter

    domain = FuncallDomain()
    assert domain.rows("train", 30, seed=3) == FuncallDomain(templates={}).rows("train", 30, seed=3)
    mixed = domain.with_options(templates={"balance": 3.0, "transfer": 1.0, "move_event": 0.0})
    counts = Counter(r["extra_info"]["task"] for r in mixed.rows("train", 400, seed=0))
    assert set(counts) == {"balance", "transfer"} and counts["balance"] > 2 * counts["transfer"], counts
    assert mixed.fingerprint() != domain.fingerprint()
    for bad, message in [({"balanse": 1.0}, "choose from"), ({"balance": -1.0}, ">= 0"), ({"balance": 0.0}, ">= 0")]:
        with pytest.raises(ValueError, match=message):
            FuncallDomain(templates=bad)
    with pytest.raises(ValueError, match="no option"):
        domain.with_options(templats={"balance": 1.0})


def test_warmup_options_are_the_warm_starts_alone(tmp_path):
    config = EmbeddedConfig(warmup_options={"templates": {"balance": 1.0}}, num_train_rows=20)
    rows = embedded._warmup_rows(FuncallDomain(), config, own_world=False)
    assert {r["extra_info"]["task"] for r in rows} == {"balance"}
    with pytest.raises(ValueError, match="warmup_hop_mix"):
        embedded._warmup_rows(config.make_domain(), config, own_world=True)
    with pytest.raises(ValueError, match="warmup_hop_mix"):
        load_config(None, ['policy.embedded.warmup_options={"templates": {"balance": 1.0}}'])
    assert EmbeddedConfig().key() == EmbeddedConfig(warmup_options={}).key() != config.key()
