"""A multi-turn agent simulator for measuring allocation without a model.

Each prompt has a hidden difficulty. A rollout's hidden success probability s starts at
s_0 = sigmoid(skill(step) - difficulty) and moves each turn as a bounded martingale:

    s' = s + d (1 - s)  with probability s,      s' = s (1 - d)  with probability 1 - s,

so E[s' | s] = s and P(success | prefix) = s at every node (the oracle's p). The episode stops after
each turn with probability `stop_prob` (between `min_turns` and `max_turns`), and the leaf's
reward is Bernoulli(s). Texts leak the hidden state the way real transcripts do, partially:
a prompt names its family and a noisy difficulty level; each turn's observation reads "ok" after
an up-move and "error" after a down-move, each only with probability `signal_reliability`. A
predictor therefore has to learn from histories, and the policy's skill drifts a little each step.

Pure numpy; it generates no tokens (segments carry token counts only) and does no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tracerl.core.history import History
from tracerl.core.tree import Segment, Tree


@dataclass(frozen=True)
class SimConfig:
    num_prompts: int = 4096  # size of the prompt set the pools are drawn from
    num_families: int = 24  # prompt families; each has its own mean difficulty
    family_spread: float = 2.5  # std of the families' mean difficulty (logits): sets how many prompts are hopeless or trivial
    prompt_spread: float = 1.2  # std of a prompt's difficulty around its family mean
    level_noise: float = 0.6  # std of the noise on the difficulty level a prompt's text shows
    jump: float = 0.3  # d: how far one turn moves the hidden success probability
    signal_reliability: float = 0.8  # chance that a turn's observation shows the true direction of its move
    min_turns: int = 2
    max_turns: int = 6
    stop_prob: float = 0.3  # chance that the episode ends after a turn (once min_turns are done)
    skill_drift: float = 0.02  # the policy's skill (logit) gain per step
    policy_tokens: tuple[int, int] = (20, 60)  # range of policy tokens per turn
    observation_tokens: tuple[int, int] = (10, 40)  # range of observation tokens per turn

    def __post_init__(self) -> None:
        if not (1 <= self.min_turns <= self.max_turns):
            raise ValueError(f"need 1 <= min_turns <= max_turns, got {self.min_turns}, {self.max_turns}")
        if not 0.0 < self.jump < 1.0 or not 0.5 <= self.signal_reliability <= 1.0:
            raise ValueError("jump must be in (0, 1) and signal_reliability in [0.5, 1]")


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


class Simulator:
    """The prompt set, its hidden difficulties, and a `RolloutRunner` over them (see `growth.RolloutRunner`)."""

    def __init__(self, config: SimConfig = SimConfig(), seed: int = 0):
        self.config = config
        rng = np.random.default_rng(seed)
        family_mean = rng.normal(0.0, config.family_spread, size=config.num_families)
        self.family = rng.integers(0, config.num_families, size=config.num_prompts)
        self.difficulty = family_mean[self.family] + rng.normal(0.0, config.prompt_spread, size=config.num_prompts)
        shown = self.difficulty + rng.normal(0.0, config.level_noise, size=config.num_prompts)
        self.level = np.clip(np.round(shown * 2), -12, 12).astype(int)  # half-logit buckets
        self.rng = np.random.default_rng(seed + 1)
        self.step = 0
        self._pool: np.ndarray = np.zeros(0, dtype=np.int64)

    # ------------------------------------------------------------------ prompts
    def p_start(self, prompt_index) -> np.ndarray:
        """True success probability of a fresh rollout at the current step."""
        return _sigmoid(self.config.skill_drift * self.step - self.difficulty[prompt_index])

    def prompt_text(self, i: int) -> str:
        level = f"minus{-self.level[i]}" if self.level[i] < 0 else f"plus{self.level[i]}"  # one word, sign kept
        return f"task family {self.family[i]} level {level} item {i}"

    def set_pool(self, prompt_indices: np.ndarray) -> list[History]:
        """Fix the step's candidate pool; returns the histories of its bare prompts."""
        self._pool = np.asarray(prompt_indices, dtype=np.int64)
        p0 = self.p_start(self._pool)
        return [History(text=self.prompt_text(i), prompt_id=str(i), meta={"true_p": float(p)})
                for i, p in zip(self._pool, p0)]

    def advance(self) -> None:
        """Next training step: the policy's skill drifts."""
        self.step += 1

    # ------------------------------------------------------------------ RolloutRunner
    def run_roots(self, prompt_indices: Sequence[int], counts: Sequence[int]) -> tuple[list[Tree], int]:
        trees, num_tokens = [], 0
        for pool_index, m in zip(prompt_indices, counts):
            i = int(self._pool[pool_index])
            p0 = float(self.p_start(i))
            tree = Tree.new(str(i), self.prompt_text(i), meta={"pool_index": int(pool_index), "source": "sim"})
            tree.root.meta["true_p"] = p0
            for _ in range(int(m)):
                num_tokens += self._rollout(tree, 0, origin="bare")
            trees.append(tree)
        return trees, num_tokens

    def run_continuations(self, requests: Sequence[tuple[Tree, int, int]]) -> int:
        return sum(self._rollout(tree, node_id, origin="continuation")
                   for tree, node_id, k in requests for _ in range(int(k)))

    def _rollout(self, tree: Tree, node_id: int, origin: str) -> int:
        """Continue from `node_id` (its hidden state restored from the node) until a leaf; returns tokens used."""
        c, rng = self.config, self.rng
        anchor = node_id
        s, depth, num_tokens = tree.nodes[node_id].meta["true_p"], tree.nodes[node_id].depth, 0
        while True:
            depth += 1
            up = rng.random() < s
            s = s + c.jump * (1.0 - s) if up else s * (1.0 - c.jump)
            shows_truth = rng.random() < c.signal_reliability
            says_ok = up if shows_truth else not up
            done = depth >= c.max_turns or (depth >= c.min_turns and rng.random() < c.stop_prob)
            num_policy = int(rng.integers(c.policy_tokens[0], c.policy_tokens[1] + 1))
            num_obs = 0 if done else int(rng.integers(c.observation_tokens[0], c.observation_tokens[1] + 1))
            num_tokens += num_policy + num_obs
            action = f"think call tool {int(rng.integers(0, 8))}" if not done else "answer"
            observation = "" if done else ("result ok" if says_ok else "result error")
            segment = Segment.text_only(action, observation, num_policy, num_obs)
            meta = {"true_p": float(s)}
            if done:
                reward = float(rng.random() < s)
                tree.add_child(node_id, segment, reward=reward, finish_reason="answer", origin=origin,
                               anchor_id=anchor, meta=meta)
                return num_tokens
            node_id = tree.add_child(node_id, segment, tool_error=not says_ok, origin=origin, anchor_id=anchor,
                                     meta=meta)
