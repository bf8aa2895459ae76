"""TRACE settings for a verl run, and stage 1 over one verl batch (plain Python + numpy, no verl import).

The settings live in a top-level `tracerl:` section of verl's Hydra config (override keys are new, so on the
command line they take a `+`, e.g. `+tracerl.method=trace`). Two of its sections are tracerl's own configs, read by
tracerl's config loader with the checks and messages `tracerl train` gives:

- `allocation` (`tracerl.core.methods.AllocationConfig`): stage-1 bounds, the root share, the continuation cost,
  stage-2 rounds and widths. The three numbers that size a step are verl's and are filled in from verl's config, so
  one number is never set twice: `num_prompts` is the batch's prompts (`data.train_batch_size`),
  `rollouts_per_prompt` is `actor_rollout_ref.rollout.n` and `pool_factor` is 1 (verl's batch is the pool). The
  step's budget is then verl's: `train_batch_size * rollout.n` trajectory units, what GRPO spends.
- `predictor` (`tracerl.train.config.PredictorConfig`): the success predictor and its options, with the trainer's
  defaults.

The rest is verl-only: the method preset, the domain, the advantage estimator, what `rm_scores` carries, the rollout
limits (a rollout's token limit defaults to `rollout.response_length`: a leaf's response is its whole path after the
prompt, and verl's actor expects it within that length), the per-turn timeout and the seed.

Advantages are computed per tree, in the worker that grew it (trees are never gathered in one place before verl's
advantage step): exact for `trace`, `grpo` and `tree_grpo`, which only look inside a prompt's tree; `treepo`'s
whitening over the batch becomes a whitening over each tree's rollouts.

`plan_batch` is stage 1 for one batch (`tracerl.core.growth.plan_roots`, the trainer's own, priced by
`tracerl.core.ledger`): the method's root policy over the batch's predicted success probabilities, then each
selected prompt's share of the stage-2 budget (split by stage-1 grants). It never returns an all-zero plan: verl's
synchronous sampler raises when every prompt of a batch is empty, so the prompt closest to p = 0.5 then gets `m_min`
rollouts (`force_plan`, counted in `alloc/forced_prompts`).

`task_domain` picks the environments: a verl user's own task when verl's config names a tool config file
(`actor_rollout_ref.rollout.multi_turn.tool_config_path`), a file of function tools (`...multi_turn.
function_tool_path`) or a custom reward function
(`reward.custom_reward_function.path`/`.name`, or the legacy top-level `custom_reward_function`), loaded by
`tracerl.io.env.verl_task` (without a custom reward, verl's `default_compute_score` scores by `data_source`, as in
verl); otherwise the built-in `tracerl.domain`.

Not offered here yet: budgets in tokens (`budget_unit = "tokens"` in the allocation section) and a step's token
cap (`token_cap`): their prices are learned from a step's trees and shared by every tree of the step, while
verl's workers grow and price their trees apart; and `allocation.stage2_mode=global`, which solves stage 2 over all
of a step's trees at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping, Sequence

import numpy as np

from tracerl.core.advantages import ADVANTAGES, AdvantageConfig
from tracerl.core.growth import force_plan, plan_roots
from tracerl.core.ledger import make_prices
from tracerl.core.methods import AllocationConfig, get_method
from tracerl.core.rules import check_fields, knob
from tracerl.io.domains import make_domain
from tracerl.io.files.config import from_dict
from tracerl.io.rollout.driver import DriverLimits
from tracerl.train.config import PredictorConfig

ESTIMATOR = "tracerl_tree"  # the name the identity advantage estimator is registered under in verl
RM_SCORES = ("advantages", "reward")
# the allocation numbers verl owns: the key a user sets them with in verl's config
VERL_OWNED = {"num_prompts": "data.train_batch_size", "rollouts_per_prompt": "actor_rollout_ref.rollout.n",
              "pool_factor": "data.train_batch_size (verl's batch is the candidate pool)"}


@dataclass(frozen=True)
class TraceVerlConfig:
    """The `tracerl:` section of a verl config, built by `from_verl` (or `from_mapping`). Unknown keys raise."""

    allocation: AllocationConfig  # tracerl's allocation section (num_prompts, rollouts_per_prompt, pool_factor: verl's)
    predictor: PredictorConfig = field(default_factory=PredictorConfig)  # tracerl's predictor section (name, options)
    method: str = "trace"  # a tracerl method preset (`tracerl methods`): stage 1, stage 2 and advantage
    domain: str = "multihop"  # built-in environments (multihop, math, funcall, bfcl) when verl names no tools/reward
    domain_options: dict = field(default_factory=dict)  # the built-in domain's constructor options (e.g. multihop's
    # world: num_entities, hops, seed; an embedded policy's are `EmbeddedConfig.domain_options()`)
    advantage: str | None = None  # tree advantage estimator; None = the method's (trace for trace)
    advantage_options: dict = field(default_factory=dict)  # AdvantageConfig fields (eps, leave_one_out, ...)
    rm_scores: str = "advantages"  # "advantages": per-token tree advantages (algorithm.adv_estimator=tracerl_tree);
    # "reward": the leaf reward on the last token, for verl's own estimators (e.g. grpo on star trees)
    max_turns: int = knob(6, ge=1)  # policy turns per rollout
    max_tokens_per_turn: int = knob(256, ge=1)  # sampled tokens per turn (capped by rollout.response_length)
    max_tokens_per_rollout: int | None = knob(None, ge=1)  # tokens after the prompt; None = rollout.response_length
    timeout_s: float = knob(600.0, gt=0)  # one turn's generation for a tree's rollouts; past it they are failed leaves
    seed: int = knob(0, ge=0)  # allocation and sampling seeds derive from it, and the predictor's

    def __post_init__(self) -> None:
        problems = check_fields(self, "tracerl.")
        try:
            method = get_method(self.method)
        except ValueError as err:
            problems.append(str(err))
            method = None
        if method is not None and method.predictor == "oracle":
            problems.append(f"method={self.method!r} needs the simulator's true p; pick trace or trace-root-only")
        if method is not None and method.in_rounds:
            problems.append(f"method={self.method!r} samples in rounds, each chosen from the last one's rewards, and "
                            "the manager plans a step's prompts once before verl samples them; for DAPO's dynamic "
                            "sampling use verl's own algorithm.filter_groups (docs/verl.md), or pick a one-shot "
                            "method (trace, trace-root-only, grpo, pcl, knapsack_rl)")
        if self.advantage is not None and self.advantage not in ADVANTAGES:
            problems.append(f"advantage={self.advantage!r}; use one of {sorted(ADVANTAGES)} or null for the method's")
        if self.rm_scores not in RM_SCORES:
            problems.append(f"rm_scores={self.rm_scores!r}; use 'advantages' (with adv_estimator={ESTIMATOR}) "
                            "or 'reward' (with one of verl's estimators)")
        problems += verl_allocation_problems(self.allocation)
        if problems:
            raise ValueError("invalid tracerl section of the verl config: " + "; ".join(problems))
        AdvantageConfig(**self.advantage_options)  # raises with its own message on a bad option
        if self.domain_options:
            try:
                make_domain(self.domain, **self.domain_options)
            except (TypeError, ValueError) as err:
                raise ValueError(f"domain_options for domain {self.domain!r}: {err}") from None

    @classmethod
    def from_mapping(cls, section: Mapping[str, Any] | None, *, num_prompts: int,
                     rollout_n: int) -> "TraceVerlConfig":
        """From the section as plain data, for a verl batch of `num_prompts` prompts at `rollout.n` samples each."""
        section = dict(section or {})
        moved = sorted(set(section) & {f.name for f in fields(AllocationConfig)})
        if moved:  # the section's flat keys of earlier releases
            raise ValueError(f"tracerl.{moved[0]}: allocation settings sit in the nested section; write "
                             f"tracerl.allocation.{moved[0]} (on the command line +tracerl.allocation.{moved[0]}=...)")
        if "predictor_options" in section:
            raise ValueError("tracerl.predictor_options: write tracerl.predictor.options (and tracerl.predictor.name)")
        allocation = section.get("allocation") or {}
        if not isinstance(allocation, Mapping):
            raise ValueError(f"tracerl.allocation is a section; give it as a table of keys, not {allocation!r}")
        allocation = dict(allocation)
        for key, verl_key in VERL_OWNED.items():
            if key in allocation:
                raise ValueError(f"tracerl.allocation.{key} is set by verl's {verl_key}; drop it from the tracerl "
                                 "section")
        if rollout_n < 2:
            raise ValueError(f"actor_rollout_ref.rollout.n={rollout_n}: TRACE's budget is batch prompts * n and a "
                             "prompt needs at least 2 rollouts to be mixed; set rollout.n >= 2")
        section["allocation"] = {**allocation, "num_prompts": int(num_prompts), "rollouts_per_prompt": int(rollout_n),
                                 "pool_factor": 1}
        return from_dict(cls, section, where="tracerl")

    @classmethod
    def from_verl(cls, config: Any) -> "TraceVerlConfig":
        """From a verl DictConfig: its optional top-level `tracerl` section, sized by verl's batch and rollout.n."""
        from omegaconf import OmegaConf

        section = OmegaConf.select(config, "tracerl", default=None)
        if OmegaConf.is_config(section):
            section = OmegaConf.to_container(section, resolve=True)
        return cls.from_mapping(section, num_prompts=int(config.data.train_batch_size),
                                rollout_n=int(config.actor_rollout_ref.rollout.n))

    @property
    def advantage_name(self) -> str:
        return self.advantage or get_method(self.method).advantage

    def limits(self, response_length: int) -> DriverLimits:
        per_rollout = self.max_tokens_per_rollout or response_length
        if per_rollout > response_length:
            raise ValueError(f"tracerl.max_tokens_per_rollout={per_rollout} exceeds rollout.response_length="
                             f"{response_length}; lower it or raise actor_rollout_ref.rollout.response_length")
        return DriverLimits(max_turns=self.max_turns, max_tokens_per_turn=min(self.max_tokens_per_turn, per_rollout),
                            max_tokens_per_rollout=per_rollout)


def verl_allocation_problems(alloc: AllocationConfig) -> list[str]:
    """What an allocation section asks that verl's workers, each growing one tree on its own, cannot do."""
    problems = []
    if make_prices(alloc).unit != "units":
        problems.append("allocation: budget_unit='tokens' is not offered on verl yet (token prices are learned from a "
                        "step's trees, which verl's workers grow apart); drop it: verl's budget is "
                        "train_batch_size * rollout.n trajectory units")
    if alloc.token_cap is not None:
        problems.append(f"allocation.token_cap={alloc.token_cap} caps a whole step's tokens, which verl's workers "
                        "cannot share; drop it (actor_rollout_ref.rollout.response_length bounds each rollout)")
    if alloc.stage2_mode != "per_prompt":
        problems.append(f"allocation.stage2_mode={alloc.stage2_mode!r} solves stage 2 over all of a step's trees at "
                        "once, but each verl worker grows one tree; drop it (per_prompt)")
    return problems


@dataclass(frozen=True)
class BatchPlan:
    """Stage 1 for one verl batch; arrays are aligned with the batch's rows."""

    p: np.ndarray  # (B,) predicted success (0.5 where the method reads none)
    counts: np.ndarray  # (B,) fresh rollouts per prompt (0 = filtered out); becomes `__rollout_n__`
    prefix_budget: np.ndarray  # (B,) stage-2 budget per prompt, in the prices' unit (trajectory units on verl)
    forced: bool  # the policy selected nothing and one prompt was given m_min so the batch is not empty


def plan_batch(p: np.ndarray, prompt_ids: Sequence[str], config: TraceVerlConfig,
               rng: np.random.Generator) -> BatchPlan:
    """Stage 1 over a batch: root counts from the method's root policy on the batch's budget (its prompts times
    rollout.n, priced by `tracerl.core.ledger`), then the stage-2 budget split by grants."""
    p = np.asarray(p, dtype=float)
    if len(p) == 0:
        raise ValueError("an empty batch cannot be planned; verl sent no prompts")
    assert len(prompt_ids) == len(p), f"{len(prompt_ids)} prompt ids for {len(p)} predictions"
    method = get_method(config.method)
    alloc = replace(config.allocation, num_prompts=len(p))  # verl may hand a batch of another size
    prices = make_prices(alloc)
    plan = plan_roots(method, alloc, p, prices.budget, rng, prices, prices.fresh(list(prompt_ids)))
    forced = not plan.counts.any()
    plan = force_plan(method, alloc, plan, p, prices.budget, prices)
    return BatchPlan(p=p, counts=plan.counts, prefix_budget=plan.prefix_budget, forced=forced)


def task_settings(config: Any) -> dict[str, Any]:
    """A verl config's tool config path, function tool path and custom reward settings ("" / {} where unset)."""
    from omegaconf import OmegaConf

    def select(key: str, default: Any = None) -> Any:
        value = OmegaConf.select(config, key, default=default)
        return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value

    reward = select("reward.custom_reward_function") or {}
    if not reward.get("path"):  # verl's legacy top-level section
        reward = select("custom_reward_function") or {}
    return {"tool_config_path": select("actor_rollout_ref.rollout.multi_turn.tool_config_path") or "",
            "function_tool_path": select("actor_rollout_ref.rollout.multi_turn.function_tool_path") or "",
            "reward_path": reward.get("path") or "", "reward_name": reward.get("name") or "compute_score",
            "reward_kwargs": dict(reward.get("reward_kwargs") or {})}


def task_domain(settings: dict[str, Any], domain: str, options: Mapping[str, Any] | None = None) -> Any:
    """The environments of a verl run: the user's task when verl's settings (`task_settings`) name one, else the
    built-in `domain` built with `options`. Takes plain data, so a Ray actor (the coordinator) builds the same domain
    as the workers."""
    if not (settings["tool_config_path"] or settings.get("function_tool_path") or settings["reward_path"]):
        return make_domain(domain, **dict(options or {}))
    from tracerl.io.env.verl_task import verl_task

    default = None
    if not settings["reward_path"]:
        from verl.utils.reward_score import default_compute_score

        def default(data_source, solution_str, ground_truth, extra_info=None):  # verl's rule-based scores
            return default_compute_score(data_source, solution_str, ground_truth, extra_info)
    return verl_task(compute_score=default, **settings)
