"""`tracerl bench ...`: each benchmark's subcommand, its arguments and the call into `tracerl.bench`. Every benchmark
module is imported only when its subcommand runs, so the core install (numpy) runs `bench alloc` alone."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path

from tracerl.io.files.runlog import finite as _finite


def say(message: str) -> None:
    """A progress line on stderr (the `tracerl` command's, for every subcommand)."""
    print(message, file=sys.stderr, flush=True)


def _bench_alloc(args: argparse.Namespace) -> int:
    from tracerl.bench import alloc

    cfg = alloc.AllocBenchConfig(seed=args.seed)
    overrides = {}
    if args.methods:
        overrides["methods"] = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    if args.steps is not None:
        overrides["num_steps"] = args.steps
    if args.warmup is not None:
        overrides["warmup_steps"] = args.warmup
    if args.num_prompts is not None:
        overrides["allocation"] = replace(cfg.allocation, num_prompts=args.num_prompts)
    cfg = _with_sets(replace(cfg, **overrides), args.set)
    if cfg.warmup_steps >= cfg.num_steps:
        raise SystemExit(f"--warmup {cfg.warmup_steps} must be below --steps {cfg.num_steps}")

    def progress(name, seconds):
        print(f"  {name:<24} done in {seconds:.1f}s", file=sys.stderr, flush=True)

    print(f"bench alloc: {len(cfg.methods)} methods x {cfg.num_steps} steps, budget "
          f"{cfg.allocation.budget:.0f} units/step, seed(s) {args.seeds or cfg.seed}", file=sys.stderr, flush=True)
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else None
    result = alloc.run_seeds(cfg, seeds, progress) if seeds else alloc.run(cfg, progress=progress)
    print(json.dumps(_finite(result)) if args.json else alloc.to_markdown(result))
    return 0


def _bench_predictors(args: argparse.Namespace) -> int:
    from tracerl.bench import predictors

    cfg = predictors.PredictorBenchConfig(seed=args.seed, run_dir=args.run_dir)
    if args.predictors:
        cfg = replace(cfg, predictors=tuple(n.strip() for n in args.predictors.split(",") if n.strip()))
    if args.steps is not None:
        cfg = replace(cfg, num_steps=args.steps)
    if args.warmup is not None:
        cfg = replace(cfg, warmup_steps=args.warmup)
    cfg = _with_sets(cfg, args.set)
    if any(n in ("minilm_head", "lm_value") for n in cfg.predictors):
        try:
            import tracerl.predictors  # noqa: F401
        except ImportError as err:
            raise SystemExit(f"the neural predictors need torch and transformers: pip install -e '.[neural]' ({err})")
    print(f"bench predictors: {', '.join(cfg.predictors)} on {args.run_dir or 'the simulator'} ...",
          file=sys.stderr, flush=True)
    result = predictors.run(cfg, progress=lambda name, s: print(f"  {name:<16} done in {s:.1f}s", file=sys.stderr))
    print(json.dumps(_finite(result)) if args.json else predictors.to_markdown(result))
    return 0


def _bench_engine(args: argparse.Namespace) -> int:
    try:
        from tracerl.bench import engine
    except ImportError as err:
        raise SystemExit(f"tracerl bench engine needs torch and transformers: pip install -e '.[torch]' ({err})")

    cfg = engine.EngineBenchConfig() if args.repeats is None else engine.EngineBenchConfig(repeats=args.repeats)
    cfg = _with_sets(cfg, args.set)
    if args.vllm and getattr(importlib.util.find_spec("vllm"), "origin", None) is None:
        raise SystemExit("tracerl bench engine --vllm needs vLLM: pip install -e '.[vllm]' in its own environment")
    print("bench engine: tree workload on a tiny Qwen3, KV reuse on vs off" + (", and vLLM" if args.vllm else "")
          + " ...", file=sys.stderr, flush=True)
    result = engine.run(cfg, vllm=args.vllm)
    print(json.dumps(_finite(result)) if args.json else engine.to_markdown(result))
    return 0


def _bench_pack(args: argparse.Namespace) -> int:
    try:
        from tracerl.bench import pack
    except ImportError as err:
        raise SystemExit(f"tracerl bench pack needs torch and transformers: pip install -e '.[torch]' ({err})")

    print("bench pack: one training step per rollout vs packed trees (tiny model) ...", file=sys.stderr, flush=True)
    cfg = pack.PackBenchConfig() if args.hidden_size is None else pack.PackBenchConfig(hidden_size=args.hidden_size)
    cfg = _with_sets(cfg, args.set)
    result = pack.run(cfg)
    print(json.dumps(_finite(result)) if args.json else pack.to_markdown(result))
    return 0


def _bench_logits(args: argparse.Namespace) -> int:
    try:
        from tracerl.bench import logits
    except ImportError as err:
        raise SystemExit(f"tracerl bench logits needs torch and transformers: pip install -e '.[torch]' ({err})")

    print("bench logits: one training step with the logits of every position vs only those that predict a policy "
          "token (tiny model, Qwen3's vocabulary) ...", file=sys.stderr, flush=True)
    result = logits.run(_with_sets(logits.DEFAULT, args.set))
    print(json.dumps(_finite(result)) if args.json else logits.to_markdown(result))
    return 0


def _bench_stage2(args: argparse.Namespace) -> int:
    from tracerl.report.stage2 import write_report

    print(write_report(args.run_dirs, out=args.out), end="")
    return 0


def _bench_alignment(args: argparse.Namespace) -> int:
    try:
        from tracerl.bench import alignment
    except ImportError as err:
        raise SystemExit(f"tracerl bench alignment needs torch and transformers: pip install -e '.[torch]' ({err})")
    from tracerl.train.compare import parse_entries

    cfg = alignment.AlignmentConfig(**{k: v for k, v in (("draws", args.draws),
                                                         ("reference_prompts", args.reference_prompts),
                                                         ("reference_samples", args.reference_samples))
                                       if v is not None})
    methods = parse_entries(args.methods)
    out = Path(args.out) if args.out else None
    results = []
    for run_dir in args.run_dirs:
        saved = out / f"{Path(run_dir).resolve().name}.json" if out else None
        if saved is not None and saved.is_file():  # a long sweep resumes: each checkpoint's result is kept
            kept = json.loads(saved.read_text())
            if list(kept["methods"]) != [label for label, _, _ in methods]:
                raise SystemExit(f"{saved} measured {', '.join(kept['methods'])}, not {args.methods}: give another "
                                 "--out, or remove it to measure again")
            results.append(kept)
            say(f"{run_dir}: kept {saved}")
            continue
        result = alignment.run(run_dir, methods, cfg, overrides=list(args.set or []), say=say)
        if saved is not None:
            saved.parent.mkdir(parents=True, exist_ok=True)
            saved.write_text(json.dumps(_finite(result), indent=1))
        results.append(result)
    text = alignment.to_markdown(results, baseline=args.baseline)
    if out is not None:
        (out / "alignment.md").write_text(text)
    print(json.dumps(_finite(alignment.summarize(results, args.baseline))) if args.json else text, end="")
    return 0


def _with_sets(cfg, sets: list[str] | None):
    """A bench config with `--set key=value` overrides applied, checked as `tracerl train` checks its own."""
    if not sets:
        return cfg
    from tracerl.io.files.config import apply_overrides, from_dict, to_dict

    return from_dict(type(cfg), apply_overrides(to_dict(cfg), sets), where="")


def _bench_view(args: argparse.Namespace) -> int:
    from tracerl.bench import view

    cfg = view.ViewBenchConfig(num_prompts=args.num_prompts, repeats=args.repeats)
    print(f"bench view: {cfg.num_prompts}-prompt synthetic step, rendered in headless chromium ...", file=sys.stderr,
          flush=True)
    try:
        result = view.run(cfg)
    except RuntimeError as err:  # no chromium, chromedriver or selenium: the message says what to install
        raise SystemExit(f"tracerl bench view: {err}")
    print(json.dumps(_finite(result)) if args.json else view.to_markdown(result))
    return 0


def add_bench_parsers(sub) -> None:
    """The `bench` subcommand and its benchmarks, under the top-level subparsers `sub`."""
    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench", required=True)
    p = bench.add_parser("alloc", help="every method on the multi-turn simulator at equal budget")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a Markdown table")
    p.add_argument("--methods", help="comma-separated method names (default: all presets and value functions)")
    p.add_argument("--steps", type=int, help="simulated training steps per method (default 40)")
    p.add_argument("--warmup", type=int, help="steps before measures are pooled (default 10)")
    p.add_argument("--num-prompts", type=int, help="prompts per step of the uniform methods (budget = this x 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", help="comma-separated seeds: report each measure's mean and std over them")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a field of the benchmark's config, e.g. --set allocation.budget_unit=tokens")
    p.set_defaults(func=_bench_alloc)

    p = bench.add_parser("engine", help="continuations with KV-cache reuse vs full re-encoding (tiny model)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a Markdown table")
    p.add_argument("--repeats", type=int, help="timed runs per mode; the fastest counts (default 2)")
    p.add_argument("--vllm", action="store_true", help="also run the workload on in-process vLLM (the vllm extra)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a field of the benchmark's config, e.g. --set allocation.budget_unit=tokens")
    p.set_defaults(func=_bench_engine)

    p = bench.add_parser("pack", help="policy-loss forward+backward per rollout vs packed trees (tiny model)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a Markdown table")
    p.add_argument("--hidden-size", type=int, help="width of the tiny model (default 128); packing pays off on wider "
                                                   "models, where the MLPs outweigh the dense tree mask")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a field of the benchmark's config, e.g. --set allocation.budget_unit=tokens")
    p.set_defaults(func=_bench_pack)

    p = bench.add_parser("logits", help="policy-loss forward+backward with the logits of every position vs only "
                                        "those that predict a policy token (tiny model, Qwen3's vocabulary)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a Markdown table")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a field of the workload (`tracerl bench pack`'s config), "
                        "e.g. --set prompt_tokens=512")
    p.set_defaults(func=_bench_logits)

    p = bench.add_parser("predictors", help="success predictors (numpy, MiniLM head, LM value head) trained online "
                                            "on one recorded sequence of steps: calibration and cost")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a Markdown table")
    p.add_argument("--run-dir", help="replay this training run's saved trees (run.save_trees=true) instead of "
                                     "the simulator")
    p.add_argument("--predictors", help="comma-separated predictor names (default: constant,hashed_logistic,"
                                        "minilm_head,lm_value)")
    p.add_argument("--steps", type=int, help="simulated steps to record (default 16)")
    p.add_argument("--warmup", type=int, help="steps before measures are pooled (default 4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a field of the benchmark's config, e.g. --set allocation.budget_unit=tokens")
    p.set_defaults(func=_bench_predictors)

    p = bench.add_parser("stage2", help="stage-2 continuations against fresh rollouts, priced, by anchor depth and "
                                        "predicted p, and fresh rollouts by their prompt's grant, from runs' "
                                        "saved trees (any method's)")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (one per seed) written with "
                                                                  "run.save_trees=true")
    p.add_argument("--out", help="also write the Markdown report to this file")
    p.set_defaults(func=_bench_stage2)

    p = bench.add_parser("alignment", help="from a run's checkpoint, each method's next steps against a large held-out "
                                           "policy gradient: does the step point up the held-out success?")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="training run directories with a checkpoint (one "
                                                                  "per seed: the summary pairs methods by checkpoint)")
    p.add_argument("--methods", default="grpo,pcl,trace",
                   help="comma-separated method presets (default grpo,pcl,trace); a variant takes overrides in "
                        "brackets, as for compare: grpo[allocation.num_prompts=32;allocation.rollouts_per_prompt=4]")
    p.add_argument("--baseline", default="grpo", help="the method the others are paired against")
    p.add_argument("--draws", type=int, help="steps each method draws from the checkpoint (default 8)")
    p.add_argument("--reference-prompts", type=int, help="held-out questions of the reference gradient (default 256)")
    p.add_argument("--reference-samples", type=int, help="rollouts per reference question (default 8)")
    p.add_argument("--out", help="folder for one JSON per checkpoint (kept and reused on a rerun) and alignment.md")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a field of the runs' config for the draws, e.g. --set run.num_threads=1")
    p.set_defaults(func=_bench_alignment)

    p = bench.add_parser("view", help="time the tree viewer's first render of a large step in headless chromium")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a Markdown table")
    p.add_argument("--num-prompts", type=int, default=200, help="trees in the synthetic step (~15 nodes each)")
    p.add_argument("--repeats", type=int, default=3, help="page loads; the median counts")
    p.set_defaults(func=_bench_view)
