"""TRACE settings for a verl run, and stage 1 over one verl batch (plain Python + numpy, no verl import).

The settings live in a top-level `tracerl:` section of verl's Hydra config (override keys are new, so on the
command line they take a `+`, e.g. `+tracerl.method=trace`). Everything else (batch size, `rollout.n`,
temperature, response length) is read from verl's own config, so one number is never set twice:

- the step's budget is verl's: `train_batch_size * rollout.n` trajectory units (what GRPO spends), split by the
  method preset between fresh rollouts (stage 1) and continuations (stage 2, `root_share`);
- a rollout's token limit defaults to `rollout.response_length` (a leaf's response is its whole path after the
  prompt, and verl's actor expects it within that length).

Advantages are computed per tree, in the worker that grew it (trees are never gathered in one place before verl's
advantage step): exact for `trace`, `grpo` and `tree_grpo`, which only look inside a prompt's tree; `treepo`'s
whitening over the batch becomes a whitening over each tree's rollouts.

`plan_batch` is stage 1 for one batch (`tracerl.core.growth.plan_roots`, the trainer's own): the method's root
policy over the batch's predicted success probabilities, then each selected prompt's share of the stage-2 budget
(split by stage-1 grants). It never returns an all-zero plan: verl's synchronous sampler raises when every prompt of a batch
is empty, so the prompt closest to p = 0.5 then gets `m_min` rollouts (counted in `alloc/forced_prompts`).

`task_domain` picks the environments: a verl user's own task when verl's config names a tool config file
(`actor_rollout_ref.rollout.multi_turn.tool_config_path`) or a custom reward function
(`reward.custom_reward_function.path`/`.name`, or the legacy top-level `custom_reward_function`), loaded by
`tracerl.io.verl_task` (without a custom reward, verl's `default_compute_score` scores by `data_source`, as in verl);
otherwise the built-in `tracerl.domain`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping

import numpy as np

from tracerl.core.advantages import ADVANTAGES, AdvantageConfig
from tracerl.core.allocation import CONTINUATION_COST, ROOT_VALUES
from tracerl.core.growth import force_plan, plan_roots
from tracerl.core.methods import AllocationConfig, get_method
from tracerl.core.predictor import PREDICTORS
from tracerl.core.rules import check_fields, knob
from tracerl.io.domains import make_domain
from tracerl.io.driver import DriverLimits

ESTIMATOR = "tracerl_tree"  # the name the identity advantage estimator is registered under in verl
RM_SCORES = ("advantages", "reward")


@dataclass(frozen=True)
class TraceVerlConfig:
    """The `tracerl:` section of a verl config. Every field has a default; unknown keys raise."""

    method: str = "trace"  # a tracerl method preset (`tracerl methods`): stage 1, stage 2 and advantage
    domain: str = "multihop"  # built-in environments (multihop, math, funcall, bfcl) when verl names no tools/reward
    predictor: str = "hashed_logistic"  # success predictor steering stages 1 and 2 (unused by grpo, treepo)
    predictor_options: dict = field(default_factory=lambda: {"l2": 1e-3})  # its constructor options
    advantage: str | None = None  # tree advantage estimator; None = the method's (trace for trace)
    advantage_options: dict = field(default_factory=dict)  # AdvantageConfig fields (eps, leave_one_out, ...)
    rm_scores: str = "advantages"  # "advantages": per-token tree advantages (algorithm.adv_estimator=tracerl_tree);
    # "reward": the leaf reward on the last token, for verl's own estimators (e.g. grpo on star trees)
    m_min: int = knob(2, ge=2)  # fewest rollouts a selected prompt gets
    m_max: int | None = knob(16, ge=2)  # most stage-1 rollouts one prompt gets
    root_value: str = knob("v_root", choices=ROOT_VALUES)  # stage-1 objective: v_root, knapsack_rl or nonzero_adv
    root_share: float = knob(0.75, gt=0, le=1)  # share of the budget spent on fresh rollouts when the method has a stage 2
    continuation_cost: float = knob(CONTINUATION_COST, gt=0)  # budget units of one continuation (a fresh rollout costs 1)
    expand_rounds: int = knob(2, ge=0)  # stage-2 rounds per prompt
    k_max: int | None = knob(4, ge=1)  # most continuations one prefix gets per round
    stage2_width: int = knob(1, ge=1)  # trace's stage 2 grants continuations in groups of this many
    branch_width: int = knob(2, ge=1)  # treepo: continuations per randomly chosen prefix
    max_turns: int = knob(6, ge=1)  # policy turns per rollout
    max_tokens_per_turn: int = knob(256, ge=1)  # sampled tokens per turn (capped by rollout.response_length)
    max_tokens_per_rollout: int | None = knob(None, ge=1)  # tokens after the prompt; None = rollout.response_length
    timeout_s: float = knob(600.0, gt=0)  # one turn's generation for all of a tree's rollouts; past it they are failed leaves
    seed: int = knob(0, ge=0)  # allocation and sampling seeds derive from it

    def __post_init__(self) -> None:
        problems = check_fields(self, "tracerl.")
        try:
            method = get_method(self.method)
        except ValueError as err:
            problems.append(str(err))
            method = None
        if method is not None and method.predictor == "oracle":
            problems.append(f"method={self.method!r} needs the simulator's true p; pick trace or trace-root-only")
        if self.predictor not in PREDICTORS or self.predictor == "oracle":
            problems.append(f"predictor={self.predictor!r}; use one of {sorted(set(PREDICTORS) - {'oracle'})}")
        if self.advantage is not None and self.advantage not in ADVANTAGES:
            problems.append(f"advantage={self.advantage!r}; use one of {sorted(ADVANTAGES)} or null for the method's")
        if self.rm_scores not in RM_SCORES:
            problems.append(f"rm_scores={self.rm_scores!r}; use 'advantages' (with adv_estimator={ESTIMATOR}) "
                            "or 'reward' (with one of verl's estimators)")
        if problems:
            raise ValueError("invalid tracerl section of the verl config: " + "; ".join(problems))
        AdvantageConfig(**self.advantage_options)  # raises with its own message on a bad option

    @classmethod
    def from_mapping(cls, section: Mapping[str, Any] | None) -> "TraceVerlConfig":
        section = dict(section or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ValueError(f"unknown key(s) {unknown} in the tracerl section of the verl config; "
                             f"known: {sorted(known)}")
        return cls(**section)

    @classmethod
    def from_verl(cls, config: Any) -> "TraceVerlConfig":
        """From a verl DictConfig (its optional top-level `tracerl` section)."""
        section = config.get("tracerl", None) if hasattr(config, "get") else None
        if section is not None and not isinstance(section, Mapping):
            from omegaconf import OmegaConf

            section = OmegaConf.to_container(section, resolve=True)
        return cls.from_mapping(section)

    @property
    def advantage_name(self) -> str:
        return self.advantage or get_method(self.method).advantage

    def allocation(self, num_prompts: int, rollout_n: int) -> AllocationConfig:
        """tracerl's allocation config for a verl batch of `num_prompts` prompts at `rollout.n` samples each."""
        if rollout_n < 2:
            raise ValueError(f"actor_rollout_ref.rollout.n={rollout_n}: TRACE's budget is batch prompts * n and a "
                             "prompt needs at least 2 rollouts to be mixed; set rollout.n >= 2")
        return AllocationConfig(num_prompts=num_prompts, rollouts_per_prompt=rollout_n, pool_factor=1,
                                m_min=self.m_min, m_max=self.m_max, root_value=self.root_value,
                                root_share=self.root_share, continuation_cost=self.continuation_cost,
                                expand_rounds=self.expand_rounds, k_max=self.k_max,
                                stage2_width=self.stage2_width, branch_width=self.branch_width)

    def limits(self, response_length: int) -> DriverLimits:
        per_rollout = self.max_tokens_per_rollout or response_length
        if per_rollout > response_length:
            raise ValueError(f"tracerl.max_tokens_per_rollout={per_rollout} exceeds rollout.response_length="
                             f"{response_length}; lower it or raise actor_rollout_ref.rollout.response_length")
        return DriverLimits(max_turns=self.max_turns, max_tokens_per_turn=min(self.max_tokens_per_turn, per_rollout),
                            max_tokens_per_rollout=per_rollout)


@dataclass(frozen=True)
class BatchPlan:
    """Stage 1 for one verl batch; arrays are aligned with the batch's rows."""

    p: np.ndarray  # (B,) predicted success (0.5 where the method reads none)
    counts: np.ndarray  # (B,) fresh rollouts per prompt (0 = filtered out); becomes `__rollout_n__`
    prefix_units: np.ndarray  # (B,) stage-2 budget per prompt in trajectory units
    forced: bool  # the policy selected nothing and one prompt was given m_min so the batch is not empty


def plan_batch(p: np.ndarray, config: TraceVerlConfig, rollout_n: int, rng: np.random.Generator) -> BatchPlan:
    """Stage 1 over a batch: root counts from the method's root policy, stage-2 budget split by grants."""
    p = np.asarray(p, dtype=float)
    num = len(p)
    if num == 0:
        raise ValueError("an empty batch cannot be planned; verl sent no prompts")
    method = get_method(config.method)
    alloc = config.allocation(num, rollout_n)
    plan = plan_roots(method, alloc, p, alloc.budget, rng)
    forced = not plan.counts.any()
    plan = force_plan(method, alloc, plan, p, alloc.budget)
    return BatchPlan(p=p, counts=plan.counts, prefix_units=plan.prefix_budget, forced=forced)


def task_settings(config: Any) -> dict[str, Any]:
    """A verl config's tool config path and custom reward settings ("" / {} where unset)."""
    from omegaconf import OmegaConf

    def select(key: str, default: Any = None) -> Any:
        value = OmegaConf.select(config, key, default=default)
        return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value

    reward = select("reward.custom_reward_function") or {}
    if not reward.get("path"):  # verl's legacy top-level section
        reward = select("custom_reward_function") or {}
    return {"tool_config_path": select("actor_rollout_ref.rollout.multi_turn.tool_config_path") or "",
            "reward_path": reward.get("path") or "", "reward_name": reward.get("name") or "compute_score",
            "reward_kwargs": dict(reward.get("reward_kwargs") or {})}


def task_domain(config: Any, trace: TraceVerlConfig) -> Any:
    """The environments of a verl run: the user's task from verl's settings when it names one, else `trace.domain`."""
    settings = task_settings(config)
    if not settings["tool_config_path"] and not settings["reward_path"]:
        return make_domain(trace.domain)
    from tracerl.io.verl_task import verl_task

    default = None
    if not settings["reward_path"]:
        from verl.utils.reward_score import default_compute_score

        def default(data_source, solution_str, ground_truth, extra_info=None):  # verl's rule-based scores
            return default_compute_score(data_source, solution_str, ground_truth, extra_info)
    return verl_task(compute_score=default, **settings)
