"""The `tracerl` command. Subcommands parse arguments and call library functions; nothing else lives here."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace


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
    cfg = replace(cfg, **overrides)
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


def _bench_engine(args: argparse.Namespace) -> int:
    try:
        from tracerl.bench import engine
    except ImportError as err:
        raise SystemExit(f"tracerl bench engine needs torch and transformers: pip install -e '.[torch]' ({err})")

    cfg = engine.EngineBenchConfig() if args.repeats is None else engine.EngineBenchConfig(repeats=args.repeats)
    print("bench engine: tree workload on a tiny Qwen3, KV reuse on vs off ...", file=sys.stderr, flush=True)
    result = engine.run(cfg)
    print(json.dumps(_finite(result)) if args.json else engine.to_markdown(result))
    return 0


def _bench_pack(args: argparse.Namespace) -> int:
    try:
        from tracerl.bench import pack
    except ImportError as err:
        raise SystemExit(f"tracerl bench pack needs torch and transformers: pip install -e '.[torch]' ({err})")

    print("bench pack: one training step per rollout vs packed trees (tiny model) ...", file=sys.stderr, flush=True)
    result = pack.run(pack.PackBenchConfig())
    print(json.dumps(_finite(result)) if args.json else pack.to_markdown(result))
    return 0


def _finite(obj):
    """NaN and inf are not JSON: report them as null."""
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if isinstance(obj, float) and obj != obj or obj in (float("inf"), float("-inf")):
        return None
    return obj


def _methods(args: argparse.Namespace) -> int:
    from tracerl.core.methods import METHODS

    for m in METHODS.values():
        stage2 = m.prefix_policy or "-"
        print(f"{m.name:<22} stage1={m.root_policy:<9} stage2={stage2:<10} adv={m.advantage:<6} {m.description}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tracerl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench", required=True)
    p = bench.add_parser("alloc", help="every method on the multi-turn simulator at equal budget")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a Markdown table")
    p.add_argument("--methods", help="comma-separated method names (default: all presets and value functions)")
    p.add_argument("--steps", type=int, help="simulated training steps per method (default 40)")
    p.add_argument("--warmup", type=int, help="steps before measures are pooled (default 10)")
    p.add_argument("--num-prompts", type=int, help="prompts per step of the uniform methods (budget = this x 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", help="comma-separated seeds: report each measure's mean and std over them")
    p.set_defaults(func=_bench_alloc)

    p = bench.add_parser("engine", help="continuations with KV-cache reuse vs full re-encoding (tiny model)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a Markdown table")
    p.add_argument("--repeats", type=int, help="timed runs per mode; the fastest counts (default 2)")
    p.set_defaults(func=_bench_engine)

    p = bench.add_parser("pack", help="policy-loss forward+backward per rollout vs packed trees (tiny model)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a Markdown table")
    p.set_defaults(func=_bench_pack)

    p = sub.add_parser("methods", help="list the method presets")
    p.set_defaults(func=_methods)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as err:  # user errors raised at the boundary carry the fix in their message
        print(f"tracerl: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
