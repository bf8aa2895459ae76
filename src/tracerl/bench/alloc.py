"""`tracerl bench alloc`: every method on the simulator at equal budget, the predictor learning online.

Each method gets a fresh simulator and `Sampler` built from the same seed (the trainer's convention), so all methods
see the same prompt set, the same pools in the same order and the same policy drift; only the way the budget is
spent differs. Measures are pooled over the steps after `warmup_steps` as ratios of sums.
Also times stage 1 alone at scale (`stage1_scale`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from tracerl.core.allocation import solve_roots
from tracerl.core.calibration import calibration_metrics
from tracerl.core.methods import METHODS, AllocationConfig, get_method
from tracerl.core.metrics import pool_counts, ratios
from tracerl.core.predictor import OraclePredictor, make_predictor
from tracerl.core.simulator import SimConfig, Simulator
from tracerl.core.step import Sampler

DEFAULT_METHODS = ("grpo", "pcl", "treepo", "trace", "trace-root-only", "trace-prefix-only", "trace-oracle",
                   "trace-uniform-prefix", "trace[knapsack_rl]", "trace[nonzero_adv]")


@dataclass(frozen=True)
class AllocBenchConfig:
    methods: tuple[str, ...] = DEFAULT_METHODS  # a name in [brackets] picks trace's stage-1 value function
    num_steps: int = 40  # training steps simulated per method
    warmup_steps: int = 10  # steps before measures are pooled (the predictor starts knowing nothing)
    seed: int = 0
    allocation: AllocationConfig = field(default_factory=lambda: AllocationConfig(num_prompts=32))
    sim: SimConfig = field(default_factory=SimConfig)
    predictor: str = "hashed_logistic"
    # weaker L2 than the class default (1e-2): with ~1,000 fresh nodes a step, prompt-level weights must outlive
    # the samples that set them, or stage 1 forgets the prompts it filtered out (chosen on this simulator)
    predictor_options: dict = field(default_factory=lambda: {"l2": 1e-3})
    stage1_num_prompts: int = 100_000  # the stage-1 timing row
    stage1_budget: float = 1_600_000.0
    stage1_repeats: int = 20  # runs of the stage-1 timing; the row reports their median (robust to a busy machine)


def _parse(name: str, base: AllocationConfig) -> tuple[str, AllocationConfig]:
    """'trace[knapsack_rl]' -> ('trace', config with root_value='knapsack_rl')."""
    if name.endswith("]") and "[" in name:
        method, value = name[:-1].split("[", 1)
        return method, replace(base, root_value=value)
    return name, base


def run_method(name: str, cfg: AllocBenchConfig) -> dict[str, float]:
    method_name, alloc = _parse(name, cfg.allocation)
    method = get_method(method_name)
    sim = Simulator(cfg.sim, seed=cfg.seed)
    if method.predictor == "oracle":
        predictor = OraclePredictor(lambda hs: np.array([h.meta["true_p"] for h in hs]))
    else:
        predictor = make_predictor(cfg.predictor, seed=cfg.seed, **cfg.predictor_options)
    sampler = Sampler(method, alloc, cfg.sim.num_prompts, cfg.seed, predictor=predictor)
    kept_counts, kept_p, kept_t, kept_w = [], [], [], []
    seconds = {"predict": 0.0, "allocate": 0.0, "update": 0.0, "step": 0.0}
    units = tokens_spent = 0.0
    for step in range(cfg.num_steps):
        t_step = time.perf_counter()
        result = sampler.step(sim)
        for key in ("predict", "allocate", "update"):
            seconds[key] += result.seconds[key]
        seconds["step"] += time.perf_counter() - t_step
        if step >= cfg.warmup_steps:
            kept_counts.append(result.counts)
            units += result.ledger.units_spent
            tokens_spent += result.ledger.tokens_spent
            if result.scored is not None:
                for kept, values in zip((kept_p, kept_t, kept_w), result.scored):
                    kept.append(values)
        sim.advance()

    row = ratios(pool_counts(kept_counts))
    num_kept = max(1, len(kept_counts))
    row.update(units_per_step=units / num_kept, tokens_per_step=tokens_spent / num_kept,
               prompts_per_step=sum(c["num_prompts"] for c in kept_counts) / num_kept)
    if kept_p:
        cal = calibration_metrics(np.concatenate(kept_p), np.concatenate(kept_t), np.concatenate(kept_w))
        row.update({f"predictor_{k}": v for k, v in cal.items()})
    else:
        row.update(predictor_brier=None, predictor_ece=None, predictor_auc=None)
    alloc_seconds = seconds["predict"] + seconds["allocate"] + seconds["update"]
    row.update(alloc_ms_per_step=1e3 * alloc_seconds / cfg.num_steps,
               alloc_overhead_frac=alloc_seconds / max(seconds["step"], 1e-12))
    return row


def time_stage1(num_prompts: int, budget: float, seed: int = 0, repeats: int = 20) -> dict[str, float]:
    """Stage 1 alone at scale: p ~ U(0, 1), unit costs, m_max unbounded. `seconds` is the median of `repeats`
    runs (wall clock), what a step on a shared machine sees; `seconds_min` the fastest run, near an idle machine."""
    if repeats < 1:
        raise ValueError(f"stage1_repeats={repeats} must be >= 1 (the stage-1 row reports the median of the runs)")
    p = np.random.default_rng(seed).random(num_prompts)
    seconds, plan = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        plan = solve_roots(p, budget)
        seconds.append(time.perf_counter() - t0)
    return {"num_prompts": num_prompts, "budget": budget, "seconds": float(np.median(seconds)),
            "seconds_min": min(seconds), "repeats": repeats, "solver": plan.solver,
            "value": plan.value, "upper_bound": plan.upper_bound,
            "rel_gap": (plan.upper_bound - plan.value) / max(plan.upper_bound, 1e-12),
            "budget_used": plan.cost, "prompts_selected": int((plan.counts > 0).sum())}


def run(cfg: AllocBenchConfig, progress=None) -> dict:
    unknown = [m for m in cfg.methods if _parse(m, cfg.allocation)[0] not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {sorted(METHODS)}")
    methods = {}
    for name in cfg.methods:
        t0 = time.perf_counter()
        methods[name] = run_method(name, cfg)
        if progress:
            progress(name, time.perf_counter() - t0)
    config = asdict(cfg)
    config["budget_per_step"] = cfg.allocation.budget
    stage1 = time_stage1(cfg.stage1_num_prompts, cfg.stage1_budget, cfg.seed, cfg.stage1_repeats)
    return {"methods": methods, "stage1_scale": stage1, "config": config}


def run_seeds(cfg: AllocBenchConfig, seeds: list[int], progress=None) -> dict:
    """`run` for each seed; each measure becomes its mean over seeds, with `<measure>_std` beside it."""
    runs = [run(replace(cfg, seed=seed), progress) for seed in seeds]
    methods = {}
    for name in cfg.methods:
        rows = [r["methods"][name] for r in runs]
        merged = {}
        for key, value in rows[0].items():
            values = [row[key] for row in rows]
            if value is None or not isinstance(value, (int, float)):
                merged[key] = value
                continue
            merged[key] = float(np.mean(values))
            merged[f"{key}_std"] = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
        methods[name] = merged
    return {"methods": methods, "seeds": list(seeds), "per_seed": [r["methods"] for r in runs],
            "stage1_scale": runs[0]["stage1_scale"], "config": runs[0]["config"]}


# priced measures first (a continuation counted at its cost; a rollout's own sampled tokens), then the counted ones
COLUMNS = ("informative_units_per_unit", "informative_sampled_tokens_per_token", "informative_rollouts_per_budget",
           "informative_tokens_per_token", "mixed_trees_per_budget", "effective_ratio", "mixed_anchors_per_budget",
           "nonzero_adv_token_frac", "units_per_step", "tokens_per_step", "prompts_per_step", "predictor_brier",
           "predictor_ece", "predictor_auc", "alloc_ms_per_step")


def to_markdown(result: dict) -> str:
    def fmt(v, std=None):
        if v is None:
            return "-"
        text = f"{v:.4f}" if isinstance(v, float) and abs(v) < 10 else f"{v:.1f}" if isinstance(v, float) else str(v)
        return text if not std else text + (f" ± {std:.4f}" if abs(v) < 10 else f" ± {std:.1f}")
    grpo = result["methods"].get("grpo", {})
    base = grpo.get("mixed_trees_per_budget")
    base_informative = grpo.get("informative_units_per_unit")
    header = "| method | " + " | ".join(COLUMNS) + (" | informative (priced) vs grpo | mixed trees vs grpo |" if base
                                                     else " |")
    lines = [header, "|" + "---|" * (len(COLUMNS) + 1 + 2 * bool(base))]
    for name, row in result["methods"].items():
        cells = [fmt(row.get(c), row.get(f"{c}_std")) for c in COLUMNS]
        if base:
            cells.append(f"{row['informative_units_per_unit'] / base_informative:.2f}x" if base_informative
                         else "-")
            cells.append(f"{row['mixed_trees_per_budget'] / base:.2f}x")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    s1 = result["stage1_scale"]
    lines.append("")
    if "seeds" in result:
        lines.append(f"mean ± std over seeds {result['seeds']}")
    if "trace" in result["methods"] and "trace-oracle" in result["methods"]:
        ratio = [r["trace"]["mixed_trees_per_budget"] / r["trace-oracle"]["mixed_trees_per_budget"]
                 for r in result.get("per_seed", [result["methods"]])]
        lines.append(f"trace / trace-oracle mixed_trees_per_budget: {np.mean(ratio):.3f}"
                     + (f" (per seed: {', '.join(f'{x:.3f}' for x in ratio)})" if len(ratio) > 1 else ""))
    lines.append(f"stage 1 at scale: {s1['num_prompts']:,} prompts, budget {s1['budget']:,.0f}: "
                 f"{1e3 * s1['seconds']:.0f} ms (median of {s1['repeats']}, fastest {1e3 * s1['seconds_min']:.0f} ms; "
                 f"{s1['solver']}), relative gap to the dual bound {s1['rel_gap']:.2e}, "
                 f"{s1['prompts_selected']:,} prompts selected")
    return "\n".join(lines)
