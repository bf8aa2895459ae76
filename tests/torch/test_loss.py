"""Policy loss: hand-computed values on 2x3 tensors, masks and zero advantages, and per rollout == packed on a tiny
random Qwen3 (same loss, same gradient for every parameter), at ratio 1 and after the policy moved (clip active)."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tracerl.core.tree import Segment, Tree
from tracerl.engines.tiny import tiny_qwen3
from helpers import random_advantages  # noqa: E402
from tracerl.train.batch import packed_batch, rollout_batch
from tracerl.train.loss import batch_logprobs, batch_policy_loss, packed_policy_loss, policy_loss, token_logprobs

VOCAB = 61
RATIO = torch.tensor([[1.0, 1.5, 0.5], [0.9, 1.1, 2.0]])
ADV = torch.tensor([[1.0, 1.0, -1.0], [-2.0, 0.5, 3.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
MOVE = 3.0  # parameter noise, in units of each tensor's std: enough for the clip to be active on ~30% of tokens


def new_logprobs() -> torch.Tensor:
    return RATIO.log().requires_grad_()  # logprobs_old = 0, so r = exp(new) = RATIO


# ------------------------------------------------------------------------------------------ hand-computed
def test_token_mean_value_gradient_and_clip_fraction_by_hand():
    # terms -min(rA, clip(r, 0.8, 1.2) A): row 0: -1, -1.2 (clipped high), +0.8 (r=0.5 clipped low with A<0);
    # row 1: +1.8, -0.55, masked. Sum -0.15 over 5 policy tokens.
    new = new_logprobs()
    loss, metrics = policy_loss(new, torch.zeros(2, 3), ADV, MASK)
    assert loss.item() == pytest.approx(-0.15 / 5, abs=1e-7)
    loss.backward()
    # d/d logprob of -rA is -rA where the unclipped branch is active, 0 where the clip is
    want = torch.tensor([[-1.0, 0.0, 0.0], [1.8, -0.55, 0.0]]) / 5
    torch.testing.assert_close(new.grad, want, rtol=0, atol=1e-7)
    assert metrics["train/clip_frac"] == pytest.approx(2 / 5)
    assert metrics["train/ratio_mean"] == pytest.approx((1 + 1.5 + 0.5 + 0.9 + 1.1) / 5)
    want_kl = sum(r - 1 - math.log(r) for r in (1, 1.5, 0.5, 0.9, 1.1)) / 5
    assert metrics["train/approx_kl"] == pytest.approx(want_kl, rel=1e-6)
    assert metrics["train/num_policy_tokens"] == 5


def test_clip_higher_and_sequence_mean_by_hand():
    loss, metrics = policy_loss(new_logprobs(), torch.zeros(2, 3), ADV, MASK, clip_eps_high=0.6)
    # r=1.5 is inside (0.8, 1.6) now: -1.5 instead of -1.2
    assert loss.item() == pytest.approx((-1 - 1.5 + 0.8 + 1.8 - 0.55) / 5, abs=1e-7)
    assert metrics["train/clip_frac"] == pytest.approx(1 / 5)
    loss, _ = policy_loss(new_logprobs(), torch.zeros(2, 3), ADV, MASK, agg="seq-mean-token-mean")
    assert loss.item() == pytest.approx(((-1 - 1.2 + 0.8) / 3 + (1.8 - 0.55) / 2) / 2, abs=1e-7)


def test_k3_kl_to_reference_by_hand():
    new = new_logprobs()
    ref = new.detach() - math.log(2)  # ref / new = 1/2 on every token: k3 = 1/2 + log 2 - 1
    loss, metrics = policy_loss(new, torch.zeros(2, 3), ADV, MASK, ref_logprobs=ref, kl_coef=0.1)
    k3 = 0.5 + math.log(2) - 1
    assert metrics["train/kl_ref"] == pytest.approx(k3, rel=1e-6)
    assert loss.item() == pytest.approx(-0.15 / 5 + 0.1 * k3, abs=1e-6)
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        policy_loss(new, torch.zeros(2, 3), ADV, MASK, kl_coef=0.1)


def test_packed_terms_are_clipped_per_leaf_not_on_the_summed_advantage():
    # one token in two rollouts with advantages +1 and -1, ratio 1.5: -min(1.5, 1.2) + -min(-1.5, -1.2) = 0.3,
    # over 2 rollout tokens. The summed advantage (0) would give 0: the clip is not linear in A.
    new = torch.tensor([[math.log(1.5)]], requires_grad=True)  # (1, 1)
    loss, _ = packed_policy_loss(new, torch.zeros(1, 1), torch.tensor([[[1.0, -1.0]]]),
                                 torch.tensor([[[True, True]]]))
    assert loss.item() == pytest.approx(0.3 / 2, abs=1e-7)
    loss.backward()
    assert new.grad.item() == pytest.approx(1.5 / 2, abs=1e-6)  # only the -A leaf's unclipped branch is live


# ------------------------------------------------------------------------------------------ masks and zeros
def test_zero_advantage_gives_zero_gradient():
    new = new_logprobs()
    loss, _ = policy_loss(new, torch.zeros(2, 3), torch.zeros(2, 3), MASK)
    loss.backward()
    assert loss.item() == 0 and new.grad.abs().max().item() == 0


def test_masked_tokens_get_no_gradient_and_their_inputs_change_nothing():
    base_new = new_logprobs()
    base, _ = policy_loss(base_new, torch.zeros(2, 3), ADV, MASK)
    base.backward()
    assert base_new.grad[1, 2] == 0, "a mask-0 token received a gradient"
    new = new_logprobs()
    adv, old = ADV.clone(), torch.zeros(2, 3)
    adv[1, 2], old[1, 2] = 1e6, -1e4  # observation token: absurd advantage and old logprob (exp overflow)
    loss, metrics = policy_loss(new, old, adv, MASK)
    loss.backward()
    assert loss.item() == base.item() and torch.equal(new.grad, base_new.grad)
    assert math.isfinite(metrics["train/ratio_mean"])


# ------------------------------------------------------------------------------------------ on a model
def small_tree(prompt_id: str, seed: int) -> Tree:
    """Branch at depth 1 (root has 3 children) and at depth 2, leaves at depths 1, 2 and 3."""
    rng = np.random.default_rng(seed)

    def seg(num_policy: int, num_obs: int) -> Segment:
        n = num_policy + num_obs
        return Segment(rng.integers(0, VOCAB, n).tolist(), [0.0] * n, [1] * num_policy + [0] * num_obs)

    tree = Tree.new(prompt_id, seg(0, 5 + seed % 3))
    a, b = tree.add_child(0, seg(4, 3)), tree.add_child(0, seg(3, 2))
    tree.add_child(0, seg(5, 0), reward=1.0)
    a1, a2 = tree.add_child(a, seg(5, 2)), tree.add_child(a, seg(2, 4))
    tree.add_child(a1, seg(3, 0), reward=1.0)
    tree.add_child(a1, seg(4, 0), reward=0.0)
    tree.add_child(a2, seg(4, 0), reward=0.0)
    tree.add_child(a, seg(6, 0), reward=1.0)
    b1 = tree.add_child(b, seg(2 + seed, 2))
    tree.add_child(b1, seg(3, 0), reward=0.0)
    return tree


@pytest.fixture(scope="module")
def step():
    """Trees whose sampling logprobs are the model's own (as an engine at temperature 1 would store them)."""
    model = tiny_qwen3(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, seed=3)
    trees = [small_tree(f"p{i}", seed=i) for i in range(3)]
    advs = [random_advantages(t, seed=20 + i) for i, t in enumerate(trees)]
    rows = rollout_batch(trees, advs)
    with torch.no_grad():
        logprobs = batch_logprobs(model, rows)  # (B, T)
    for (t, leaf), row in zip(rows.rollouts, logprobs):
        offset = 0
        for node_id in trees[t].path(leaf):
            seg = trees[t].nodes[node_id].segment
            seg.logprobs = [v if m else 0.0 for v, m in zip(row[offset: offset + seg.num_tokens].tolist(), seg.mask)]
            offset += seg.num_tokens
    return model, trees, advs


def loss_and_grads(model, batch, **kwargs):
    model.zero_grad(set_to_none=True)
    loss, metrics = batch_policy_loss(model, batch, **kwargs)
    loss.backward()
    return loss.item(), metrics, {n: p.grad.clone() for n, p in model.named_parameters()}


def assert_same_gradients(got: dict, want: dict, what: str) -> None:
    for name, g in want.items():
        scale = g.abs().max().item()
        err = (got[name] - g).abs().max().item()
        assert err <= 1e-5 * scale + 1e-9, f"{what}: gradient of {name} differs by {err:.2e} (scale {scale:.2e})"


def perturbed(model, scale: float, seed: int):
    moved = tiny_qwen3(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, seed=3)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(scale * p.std().clamp(min=1e-2) * torch.randn(p.shape, generator=gen))
    return moved


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("split_depth", [0, 1])
def test_packed_equals_per_rollout_at_ratio_one_and_after_the_policy_moved(step, attn, split_depth):
    model, trees, advs = step
    rows, packed = rollout_batch(trees, advs), packed_batch(trees, advs, split_depth=split_depth)
    assert packed.num_tokens < rows.num_tokens, f"packed computes {packed.num_tokens} >= {rows.num_tokens} tokens"
    # ratio 1: the model that sampled; then a moved policy, where per-leaf clipping matters
    for label, policy in (("ratio 1", model), ("moved", perturbed(model, MOVE, seed=1))):
        policy.set_attn_implementation(attn)
        for kwargs in ({}, {"agg": "seq-mean-token-mean", "clip_eps_high": 0.28}):
            want_loss, want_metrics, want_grads = loss_and_grads(policy, rows, **kwargs)
            got_loss, got_metrics, got_grads = loss_and_grads(policy, packed, **kwargs)
            what = f"{label}, {attn}, split_depth={split_depth}, {kwargs}"
            assert got_loss == pytest.approx(want_loss, rel=1e-5, abs=1e-7), what
            assert_same_gradients(got_grads, want_grads, what)
            for key in ("train/clip_frac", "train/ratio_mean", "train/num_policy_tokens"):
                assert got_metrics[key] == pytest.approx(want_metrics[key], rel=1e-5, abs=1e-7), f"{what}: {key}"
        if label == "ratio 1":
            assert want_metrics["train/clip_frac"] == 0 and abs(want_metrics["train/ratio_mean"] - 1) < 1e-5
        else:
            assert 0.1 < want_metrics["train/clip_frac"] < 0.9, f"clip barely active: {want_metrics}"


def test_summed_advantage_packing_is_exact_only_at_ratio_one(step):
    """The check above can fail: clipping the per-node summed advantage instead of each leaf's term differs."""
    model, trees, advs = step
    packed = packed_batch(trees, advs)

    def summed(policy):
        new = batch_logprobs(policy, packed)  # (B, T)
        r = (new - packed.logprobs_old).exp()  # (B, T)
        a = packed.summed_advantages  # (B, T)
        pg = torch.maximum(-a * r, -a * r.clamp(0.8, 1.2))  # (B, T)
        return (pg * packed.loss_mask).sum().item() / packed.num_policy_tokens

    for label, policy, same in (("ratio 1", model, True), ("moved", perturbed(model, MOVE, seed=1), False)):
        per_leaf = batch_policy_loss(policy, packed)[0].item()
        assert (abs(summed(policy) - per_leaf) < 1e-6) == same, f"{label}: {summed(policy)} vs {per_leaf}"


def test_token_logprobs_shift_temperature_and_padding():
    model = tiny_qwen3(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, seed=4)
    seq = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(0))  # (1, 9)
    with torch.no_grad():
        logits = model(seq).logits[0]  # (9, V)
        want = torch.log_softmax(logits / 0.7, -1)[torch.arange(8), seq[0, 1:]]  # (8,)
        padded = torch.cat([seq, torch.zeros(1, 4, dtype=torch.long)], 1)  # (1, 13)
        mask = torch.cat([torch.ones(1, 9), torch.zeros(1, 4)], 1).long()  # (1, 13)
        got = token_logprobs(model, torch.cat([padded, padded]), torch.cat([mask, mask]), temperature=0.7)
    assert got[:, 0].abs().max() == 0, "the first token has no predictor"
    torch.testing.assert_close(got[0, 1:9], want, rtol=1e-5, atol=1e-5)


def test_tree_mask_with_an_attention_that_ignores_it_is_refused(step):
    _, trees, advs = step
    packed = packed_batch(trees, advs)
    other = tiny_qwen3(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, seed=3)
    other.config._attn_implementation = "flash_attention_2"  # would drop an arbitrary 4D mask
    with pytest.raises(ValueError, match="set_attn_implementation"):
        batch_logprobs(other, packed)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_trees_train_under_bfloat16_autocast_like_rollouts_do(step, attn):
    """policy.precision=bfloat16: the packed tree mask (additive, float32) meets bfloat16 scores; the loss and the
    gradients agree with the per-rollout ones under the same autocast to bfloat16's error."""
    from tracerl.train.policy import autocast

    model, trees, advs = step
    policy = perturbed(model, MOVE, seed=2)
    policy.set_attn_implementation(attn)
    results = []
    for batch in (rollout_batch(trees, advs), packed_batch(trees, advs)):
        policy.zero_grad(set_to_none=True)
        with autocast(torch.device("cpu"), torch.bfloat16):
            loss, _ = batch_policy_loss(policy, batch)
        loss.backward()
        results.append((loss.item(), {n: p.grad.clone() for n, p in policy.named_parameters()}))
    (want_loss, want_grads), (got_loss, got_grads) = results
    assert np.isfinite(got_loss) and got_loss == pytest.approx(want_loss, rel=0.05, abs=1e-3)
    for name, g in want_grads.items():
        scale = g.abs().max().item()
        assert (got_grads[name] - g).abs().max().item() <= 0.1 * scale + 1e-6, f"{attn}: gradient of {name}"


# ------------------------------------------------------------------------------------------ logits kept
class CountingLogits(torch.nn.Module):
    """`model`, recording the sequence length of every logits tensor it returns."""

    def __init__(self, model):
        super().__init__()
        self.model, self.config, self.widths = model, model.config, []

    def get_base_model(self):  # as a PEFT wrapper names the model it wraps
        return self.model

    def forward(self, **kwargs):
        out = self.model(**kwargs)
        self.widths.append(out.logits.shape[1])
        return out


@pytest.mark.parametrize("layout", ["rollouts", "packed"])
def test_the_loss_computes_logits_only_where_a_policy_token_is_predicted_and_keeps_every_value(step, layout):
    """The batch functions read policy tokens only (`needed`): the model returns logits at fewer positions than the
    row has, and the logprobs at policy tokens, the loss and every gradient are those of the full logits (0 at
    every other token, where the full path has values)."""
    model, trees, advs = step
    policy = perturbed(model, MOVE, seed=3)
    batch = rollout_batch(trees, advs) if layout == "rollouts" else packed_batch(trees, advs)
    counting = CountingLogits(policy)
    with torch.no_grad():
        full = token_logprobs(policy, **batch.model_inputs())  # (B, T): every predicted token
        kept = batch_logprobs(counting, batch)
    width = batch.input_ids.shape[1]
    assert counting.widths and all(w < width for w in counting.widths), f"{counting.widths} logits of {width}"
    policy_tokens = batch.loss_mask > 0
    torch.testing.assert_close(kept[policy_tokens], full[policy_tokens], rtol=1e-6, atol=1e-6)
    assert kept[~policy_tokens].abs().max() == 0 and full[~policy_tokens].abs().max() > 0
    mask = batch.leaf_mask if layout == "packed" else (batch.loss_mask > 0).unsqueeze(-1)
    advantages = batch.advantages if layout == "packed" else batch.advantages.unsqueeze(-1)
    grads = []
    for logprobs in (lambda: token_logprobs(policy, **batch.model_inputs()), lambda: batch_logprobs(policy, batch)):
        policy.zero_grad(set_to_none=True)
        loss, _ = packed_policy_loss(logprobs(), batch.logprobs_old, advantages, mask)
        loss.backward()
        grads.append((loss.item(), {n: p.grad.clone() for n, p in policy.named_parameters()}))
    (want_loss, want_grads), (got_loss, got_grads) = grads
    assert got_loss == pytest.approx(want_loss, rel=1e-6, abs=1e-8)
    assert_same_gradients(got_grads, want_grads, f"kept logits, {layout}")


def test_nothing_to_read_still_gives_a_loss_with_a_zero_gradient_and_a_model_without_the_option_gets_all(step):
    """No policy token in the batch: one position is kept, the loss is 0 and backpropagates to zero gradients. A model
    whose forward does not take `logits_to_keep` gets the full logits and gives the same values."""
    model, trees, advs = step
    batch = rollout_batch(trees, advs)
    policy = perturbed(model, MOVE, seed=4)
    counting = CountingLogits(policy)
    none = torch.zeros_like(batch.loss_mask, dtype=torch.bool)
    logprobs = token_logprobs(counting, **batch.model_inputs(), needed=none)
    assert counting.widths == [1] and logprobs.abs().max() == 0
    loss, _ = packed_policy_loss(logprobs, batch.logprobs_old, batch.advantages.unsqueeze(-1), none.unsqueeze(-1))
    loss.backward()
    assert loss.item() == 0 and all(p.grad is None or p.grad.abs().max() == 0 for p in policy.parameters())

    class NoOption(torch.nn.Module):  # a forward without `logits_to_keep`
        def __init__(self):
            super().__init__()
            self.inner = policy

        def forward(self, input_ids, attention_mask, position_ids=None, use_cache=False):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              use_cache=use_cache)

    with torch.no_grad():
        got, want = batch_logprobs(NoOption(), batch), batch_logprobs(policy, batch)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
