"""`tracerl bench predictors`: success predictors trained online on one recorded sequence of steps.

Trees are recorded once: by default `num_steps` steps of the `trace` method on the multi-turn simulator
(steered by the numpy predictor, fixed seed, as in `tracerl bench alloc`), or the saved trees of a training
run (`run_dir`, written with run.save_trees=true). Every predictor then replays the same sequence: at each
step it predicts the step's nodes (scored *before* learning from them, as the trainer does), then updates on
their backed-up targets (Vhat, weight n). Replaying a run, `hashed_logistic` takes the options the run
trained it with (its config.json); on the simulator, those of `tracerl bench alloc`. Reported per predictor:
Brier, ECE and AUC pooled over the steps after `warmup_steps` (AUC and ECE also apart for roots, which stage 1
reads, and prefixes, which stage 2 reads; and AUC over the roots predicted within `MID_BAND`, the prompts whose
group is likely mixed: a predictor ranks well over a pool of easy, hard and impossible questions by telling those
apart, and `auc_root_mid` says how well it ranks the prompts stage 1 is left to choose among, which is also what
roots of trees that stage 1 selected look like), and the cost in seconds per 1,000 prefixes of `predict` and of
`update` (wall clock, torch threads 1), plus the seconds it took to build (model loading).

`lm_value` runs on a tiny *random* Qwen3 with a tokenizer trained on the recorded texts: an untrained tiny
LM is a plumbing and cost check, not a claim about what a pretrained LM's hidden state is worth.

Deliberately not here: allocation quality with each predictor (that is `tracerl bench alloc` with
`predictor=`), GPU timings, hyper-parameter search.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tracerl.core.calibration import calibration_metrics
from tracerl.core.history import History
from tracerl.core.methods import AllocationConfig, get_method
from tracerl.core.metrics import predictor_targets
from tracerl.core.predictor import make_predictor
from tracerl.core.simulator import SimConfig, Simulator
from tracerl.core.step import Sampler
from tracerl.core.tree import Tree

DEFAULT_PREDICTORS = ("constant", "hashed_logistic", "minilm_head", "lm_value")
Step = tuple[list[History], np.ndarray, np.ndarray]  # (histories, Vhat, n) of one step's nodes


@dataclass(frozen=True)
class PredictorBenchConfig:
    predictors: tuple[str, ...] = DEFAULT_PREDICTORS  # "constant" is the running mean of the targets: a floor
    num_steps: int = 16  # simulated steps recorded (ignored with run_dir: all its saved steps are used)
    warmup_steps: int = 4  # steps before measures are pooled (every predictor starts knowing nothing)
    seed: int = 0  # simulator, recording allocation and every predictor's seed
    method: str = "trace"  # the method whose trees are recorded
    allocation: AllocationConfig = field(default_factory=lambda: AllocationConfig(num_prompts=32))
    sim: SimConfig = field(default_factory=SimConfig)
    run_dir: str | None = None  # replay a training run's saved trees instead of the simulator
    tiny_lm_hidden_size: int = 64  # width of the random Qwen3 behind lm_value
    torch_threads: int = 1


def record_simulator(cfg: PredictorBenchConfig) -> list[Step]:
    """`num_steps` steps of `cfg.method` on the simulator, allocation steered by the numpy predictor."""
    sim = Simulator(cfg.sim, seed=cfg.seed)
    sampler = Sampler(get_method(cfg.method), cfg.allocation, cfg.sim.num_prompts, cfg.seed,
                      predictor=make_predictor("hashed_logistic", seed=cfg.seed, l2=1e-3))
    steps = []
    for _ in range(cfg.num_steps):
        result = sampler.step(sim)
        steps.append(result.targets if result.targets is not None else predictor_targets(result.trees))
        sim.advance()
    return steps


def record_run(run_dir: str | Path) -> list[Step]:
    """Every step's saved trees of a training run (`<run_dir>/trees/step-*.json.gz`), in step order."""
    from tracerl.io.files.runlog import TREES_DIR, read_trees

    files = sorted((Path(run_dir) / TREES_DIR).glob("step-*.json.gz"))
    if not files:
        raise ValueError(f"{run_dir} has no saved trees; train with --set run.save_trees=true")
    steps = []
    for f in files:
        record = read_trees(run_dir, int(f.name[5:11]))
        steps.append(predictor_targets([Tree.from_dict(t) for t in record["trees"]]))
    return steps


def tiny_lm_dir(texts: list[str], directory: Path, hidden_size: int = 64, seed: int = 0) -> Path:
    """Save a random tiny Qwen3 and a BPE tokenizer trained on `texts` into `directory`; returns it."""
    from tracerl.engines.tiny import tiny_qwen3
    from tracerl.io.rollout.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(texts, vocab_size=512)
    model = tiny_qwen3(vocab_size=max(512, len(tokenizer)), hidden_size=hidden_size, seed=seed)
    tokenizer.save_pretrained(directory)
    model.save_pretrained(directory)
    return directory


MID_BAND = (0.2, 0.8)  # predicted success of the roots `auc_root_mid` ranks: a group of 8 is then likely mixed


def evaluate(predictor, steps: list[Step], warmup_steps: int) -> dict[str, float]:
    """Online replay: score each step's nodes, then update on them; pooled measures and per-1k-prefix seconds."""
    kept_p, kept_t, kept_w, kept_root = [], [], [], []
    seconds = {"predict": 0.0, "update": 0.0}
    num_prefixes = 0
    for i, (histories, targets, weights) in enumerate(steps):
        t0 = time.perf_counter()
        p = predictor.predict(histories)
        t1 = time.perf_counter()
        predictor.update(histories, targets, weights)
        t2 = time.perf_counter()
        seconds["predict"] += t1 - t0
        seconds["update"] += t2 - t1
        num_prefixes += len(histories)
        if i >= warmup_steps:
            kept_p.append(p), kept_t.append(targets), kept_w.append(weights)
            kept_root.append(np.array([h.depth == 0 for h in histories], dtype=bool))
    nan = {"brier": float("nan"), "ece": float("nan"), "auc": float("nan")}
    row = calibration_metrics(np.concatenate(kept_p), np.concatenate(kept_t), np.concatenate(kept_w)) \
        if kept_p else dict(nan)
    if kept_p:  # stage 1 reads the roots, stage 2 the prefixes: each gets its own measures
        p, t, w, root = (np.concatenate(a) for a in (kept_p, kept_t, kept_w, kept_root))
        for name, chosen in (("root", root), ("prefix", ~root)):
            part = calibration_metrics(p[chosen], t[chosen], w[chosen]) if chosen.any() else nan
            row.update({f"{k}_{name}": v for k, v in part.items() if k in ("auc", "ece")})
        mid = root & (p >= MID_BAND[0]) & (p <= MID_BAND[1])
        row["auc_root_mid"] = calibration_metrics(p[mid], t[mid], w[mid])["auc"] if mid.any() else float("nan")
        row["root_mid_share"] = float(mid.sum() / max(root.sum(), 1))
    row.update(predict_s_per_1k=1e3 * seconds["predict"] / max(num_prefixes, 1),
               update_s_per_1k=1e3 * seconds["update"] / max(num_prefixes, 1), num_prefixes=num_prefixes)
    return row


def _run_config(cfg: PredictorBenchConfig) -> dict[str, Any]:
    """The recorded run's saved config (`<run_dir>/config.json`), or {} on the simulator."""
    path = Path(cfg.run_dir) / "config.json" if cfg.run_dir else None
    if path is None or not path.exists():
        return {}
    import json

    return json.loads(path.read_text())


def _state_features(cfg: PredictorBenchConfig, run_config: dict[str, Any]):
    """The recorded run's domain hook, as its trainer handed it to the predictor (None on the simulator, or for a
    task of the user's own, whose code the bench does not load)."""
    domain = run_config.get("data", {}).get("domain", "multihop" if cfg.run_dir else None)
    if domain is None or domain == "task":
        return None
    from tracerl.io.domains import make_domain

    return make_domain(domain).state_features


def _options(name: str, run_config: dict[str, Any], lm_dir: Callable[[], Path]) -> dict[str, Any]:
    if name == "constant":
        return {"track_mean": True}
    if name == "hashed_logistic":
        trained = run_config.get("predictor", {})
        if trained.get("name") == name:  # the options the run trained it with
            return dict(trained.get("options", {}))
        return {"l2": 1e-3}  # the setting `tracerl bench alloc` uses
    if name == "lm_value":
        path = str(lm_dir())
        return {"model_path": path, "tokenizer_path": path}
    return {}


def run(cfg: PredictorBenchConfig, progress=None) -> dict:
    if cfg.warmup_steps < 0:
        raise ValueError(f"warmup_steps={cfg.warmup_steps}; use >= 0")
    neural = [n for n in cfg.predictors if n in ("minilm_head", "lm_value")]
    if neural:
        import torch

        torch.set_num_threads(cfg.torch_threads)
    t0 = time.perf_counter()
    steps = record_run(cfg.run_dir) if cfg.run_dir else record_simulator(cfg)
    if cfg.warmup_steps >= len(steps):
        raise ValueError(f"warmup_steps={cfg.warmup_steps} leaves none of the {len(steps)} recorded steps to score; "
                         "lower it or record more steps")
    record_seconds = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        lm_path: list[Path] = []

        def lm_dir() -> Path:
            if not lm_path:
                texts = [h.text for h in steps[0][0]]
                lm_path.append(tiny_lm_dir(texts, Path(tmp) / "tiny-lm", cfg.tiny_lm_hidden_size, cfg.seed))
            return lm_path[0]

        rows = {}
        run_config = _run_config(cfg)
        hook = _state_features(cfg, run_config)
        for name in cfg.predictors:
            t0 = time.perf_counter()
            predictor = make_predictor(name, seed=cfg.seed, state_features=hook, **_options(name, run_config, lm_dir))
            build_seconds = time.perf_counter() - t0
            rows[name] = {**evaluate(predictor, steps, cfg.warmup_steps), "build_s": build_seconds}
            if progress:
                progress(name, time.perf_counter() - t0)
    config = asdict(cfg)
    return {"predictors": rows, "num_steps": len(steps), "nodes_per_step": float(np.mean([len(s[0]) for s in steps])),
            "record_s": record_seconds, "config": config}


COLUMNS = ("brier", "ece", "auc", "auc_root", "auc_prefix", "auc_root_mid", "root_mid_share", "predict_s_per_1k",
           "update_s_per_1k", "build_s")
FOUR_DIGITS = ("brier", "ece", "root_mid_share")  # and every auc*


def to_markdown(result: dict) -> str:
    lines = ["| predictor | " + " | ".join(COLUMNS) + " |", "|" + "---|" * (len(COLUMNS) + 1)]
    for name, row in result["predictors"].items():
        lines.append(f"| {name} | " + " | ".join(f"{row[c]:.4f}" if c in FOUR_DIGITS or c.startswith("auc")
                                                else f"{row[c]:.3f}"
                                                for c in COLUMNS) + " |")
    cfg = result["config"]
    source = f"run {cfg['run_dir']}" if cfg["run_dir"] else f"simulator, method {cfg['method']}, seed {cfg['seed']}"
    lines += ["", f"{result['num_steps']} steps ({source}), {result['nodes_per_step']:.0f} prefixes per step; "
              f"measures pooled after {cfg['warmup_steps']} warm-up steps; seconds per 1,000 prefixes, "
              f"torch threads {cfg['torch_threads']}.",
              "lm_value runs on a tiny random Qwen3: a plumbing and cost check, not a quality claim."]
    return "\n".join(lines)
