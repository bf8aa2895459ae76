"""How much sampling noise coupled evaluation takes out of a paired comparison, measured on finished runs.

    python studies/coupled_eval.py RUN_A RUN_B [RUN_A2 RUN_B2 ...] [--out FILE.md]

Each pair is two runs of one seed (same starting weights, same held-out questions: two entries of a `tracerl
compare` folder). For each pair it reads both runs' final held-out evaluation as recorded and evaluates both final
checkpoints again with the other sampling: coupled (`run.eval_coupled`: every sample from its own stream keyed by
seed, question, sample and turn) where the runs recorded independent sampling (the default), independent where they
recorded coupled; and, as the noise floor (unless --no-floor), run A's checkpoint once more with independent
sampling and another seed. Per pair it prints the spread over questions of the per-question difference A - B (and
A - A' for the floor) and the standard error of the mean difference it implies:

    var(d) = 2 var_sampling + var_true,   d = per-question success of A minus that of B (avg@k each)

The floor (one policy, two independent draws) is 2 var_sampling alone; coupling lowers the sampling part where
the two policies' distributions agree, and leaves var_true (how the policies really differ per question).

Deliberately not here: a new design of comparisons (`studies/preregistration.md` fixes those); this only
measures what coupling would change.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

from tracerl.core.stats import seed_mean
from tracerl.engines import torch_threads
from tracerl.io.files.runlog import read_metrics
from tracerl.policy.evaluation import evaluate_rows
from tracerl.train import checkpoint
from tracerl.train.config import load_config
from tracerl.train.policy import load_policy

FLOOR_SEED_OFFSET = 7919  # the floor's second draw: the run's seed plus this


def final_eval(run_dir: Path) -> dict:
    rows = [r for r in read_metrics(run_dir) if r["kind"] == "eval"]
    return rows[-1]


def evaluate_checkpoint(run_dir: Path, coupled: bool, seed_offset: int = 0) -> tuple[np.ndarray, float]:
    """Per-question success of the run's latest checkpoint on its own held-out questions, and the seconds taken."""
    config = load_config(str(run_dir / "config.json"))
    policy = load_policy(config)
    path = checkpoint.latest(run_dir)  # the newest intact checkpoint; only its weights are read, nothing is written
    if path is None:
        raise SystemExit(f"{run_dir} has no checkpoint to evaluate")
    with checkpoint.open_regular(path / checkpoint.MODEL_FILE) as f:
        policy.model.load_state_dict(torch.load(f, map_location="cpu", weights_only=True))
    cfg = config.run
    rows = policy.domain.rows("test", cfg.eval_prompts, seed=cfg.seed)
    started = time.perf_counter()
    result = evaluate_rows(policy.model, policy.renderer, policy.domain, policy.limits, rows, cfg.eval_samples,
                           cfg.eval_temperature, seed=cfg.seed + seed_offset,
                           max_batch_size=config.policy.max_batch_size, coupled=coupled)
    return np.asarray(result["eval/per_prompt"]), time.perf_counter() - started


def spread(d: np.ndarray) -> str:
    sd = float(d.std(ddof=1))
    return f"{sd:.4f} | {100 * sd / math.sqrt(len(d)):.2f} | {100 * d.mean():+.2f}"


def recorded_coupled(run_dir: Path) -> bool:
    """Whether the run's own evaluations sampled coupled (its saved `run.eval_coupled`)."""
    return bool(load_config(str(run_dir / "config.json")).run.eval_coupled)


def pair_evaluations(a: Path, b: Path) -> dict[str, list[np.ndarray]]:
    """Both runs' final per-question success under each sampling: "independent" and "coupled", one of them as
    recorded and the other evaluated again from the final checkpoints."""
    coupled = recorded_coupled(a)
    if coupled != recorded_coupled(b):
        raise SystemExit(f"{a} and {b} recorded different sampling (run.eval_coupled): pair runs of one comparison")
    recorded = [np.asarray(final_eval(r)["eval/per_prompt"]) for r in (a, b)]
    again = [evaluate_checkpoint(r, coupled=not coupled)[0] for r in (a, b)]
    return {"coupled": recorded, "independent": again} if coupled else {"independent": recorded, "coupled": again}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="pairs of run folders: A B [A2 B2 ...]")
    parser.add_argument("--no-floor", action="store_true", help="skip the noise floor (one evaluation a pair less)")
    parser.add_argument("--out", help="also write the table to this Markdown file")
    args = parser.parse_args(argv)
    if len(args.runs) % 2:
        raise SystemExit("give the runs in pairs (A B), two runs of one seed each")
    lines = ["| pair | sampling | sd of the per-question difference | SE of the mean difference, points | "
             "mean difference, points |", "|---|---|---|---|---|"]
    ratios = []
    with torch_threads(1):
        for a, b in zip(args.runs[::2], args.runs[1::2]):
            a, b = Path(a), Path(b)
            pair, coupled_first = f"{a.name} - {b.name}", recorded_coupled(a)
            runs = pair_evaluations(a, b)
            for mode in ("independent", "coupled"):
                how = "as recorded" if (mode == "coupled") == coupled_first else "evaluated again"
                lines.append(f"| {pair} | {mode} ({how}) | {spread(runs[mode][0] - runs[mode][1])} |")
            if not args.no_floor:
                floor, _ = evaluate_checkpoint(a, coupled=False, seed_offset=FLOOR_SEED_OFFSET)
                lines.append(f"| {a.name} - itself | independent, another seed (noise floor) | "
                             f"{spread(runs['independent'][0] - floor)} |")
            coupled, independent = (float(np.var(runs[mode][0] - runs[mode][1], ddof=1))
                                    for mode in ("coupled", "independent"))
            ratios.append(coupled / independent if independent > 0 else float("nan"))  # no spread: no ratio
            print(lines[-3 + args.no_floor:], file=sys.stderr, flush=True)
    text = "\n".join(lines) + (f"\n\nVariance of the per-question difference, coupled over independent: "
                               f"{', '.join(f'{r:.2f}' for r in ratios)} (pairs in order)")
    if len(ratios) > 1:
        share = seed_mean(ratios)
        text += f"; mean {share.mean:.2f}, 95% t interval [{share.lo:.2f}, {share.hi:.2f}] over the {len(ratios)} pairs"
    text += ".\n"
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0

if __name__ == "__main__":
    sys.exit(main())
