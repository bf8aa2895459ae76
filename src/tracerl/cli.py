"""The `tracerl` command. Subcommands parse arguments and call library functions; nothing else lives here."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tracerl.bench.commands import add_bench_parsers, say as _say
from tracerl.io.files.runlog import finite as _finite


def _config(args: argparse.Namespace) -> int:
    """Every field of `tracerl train`'s config: key, type, the default or --config/--set's value, rule, doc."""
    from tracerl.core.rules import describe_fields
    from tracerl.train.config import TrainConfig

    for row in describe_fields(TrainConfig, defaults=_train_config(args) if args.config or args.set else None):
        rule = f"  ({row['rule']})" if row["rule"] else ""
        print(f"{row['key']}  {row['type']} = {row['default']}{rule}")
        if row["doc"]:
            print(f"    {row['doc']}")
    return 0


def _train_config(args: argparse.Namespace):
    from tracerl.train.config import load_config

    overrides = list(args.set or [])
    if getattr(args, "out", None):
        overrides.append(f"run.out_dir={args.out}")
    if getattr(args, "executor", None):
        overrides.append(f"run.executor={args.executor}")
    return load_config(args.config, overrides)


def _train(args: argparse.Namespace) -> int:
    from tracerl.train.progress import print_summary, progress_bar
    from tracerl.train.trainer import run_training

    config = _train_config(args)
    say = _say
    length = (f"until {config.run.total_token_budget:,} sampled tokens (at most {config.run.num_steps} steps)"
              if config.run.total_token_budget else f"{config.run.num_steps} steps")
    say(f"train: method {config.method}, {length} of {config.allocation.budget:.0f} budget units, "
        f"domain {config.data.domain}, policy {config.policy.model}, run directory {config.out_dir()}")
    with progress_bar(config) as bar:
        result = run_training(config, resume=args.resume, say=bar.write if bar else say,
                              progress=bar.update if bar else None)
    print_summary(result)
    return _report_faults(config.out_dir())


def _report_faults(run_dir) -> int:
    """Print the run's reward failures (they are failed leaves, easy to mistake for a policy that learned nothing);
    exit status 1 when every reward call failed."""
    from tracerl.io.files.runlog import read_metrics
    from tracerl.report.run_report import fault_counts, fault_lines

    counts = fault_counts(read_metrics(run_dir))
    for line in fault_lines(counts):
        print(line)
    calls = sum(c["reward_calls"] for c in counts.values())
    if calls and sum(c["reward_errors"] + c["reward_timeouts"] for c in counts.values()) == calls:
        print(f"tracerl: error: every reward call of {run_dir} failed; the trees (tracerl view {run_dir}) show the "
              "error", file=sys.stderr)
        return 1
    return 0


def _eval(args: argparse.Namespace) -> int:
    from tracerl.train.checkpoint import saved_config
    from tracerl.train.policy import load_policy
    from tracerl.train.trainer import Trainer, format_eval

    if not args.config and args.out:  # the run's own config: a checkpoint loads only beside it
        args.config = saved_config(args.out, needed=args.checkpoint)
    args.set = [*(args.set or []), "run.tensorboard=false"]
    config = _train_config(args)
    trainer = Trainer(config, load_policy(config, _say), say=_say)
    if args.checkpoint and not trainer.resume():
        raise ValueError(f"{config.out_dir()} has no checkpoint; train first or drop --checkpoint")
    from tracerl.engines import torch_threads

    with torch_threads(config.run.num_threads):
        row = trainer.evaluate(log=False)
    print(f"held-out success at step {trainer.step}: {format_eval(row)} ({row['eval/num_prompts']} questions x "
          f"{config.run.eval_samples} samples)")
    from tracerl.report.run_report import fault_counts, fault_lines

    for line in fault_lines(fault_counts([row])):
        print(line)
    return 0


def _compare(args: argparse.Namespace) -> int:
    from tracerl.train.compare import compare_status, parse_seeds, run_compare

    seeds = parse_seeds(args.seeds)
    if args.status:
        print(compare_status(args.methods, seeds, args.out, config_path=args.config, overrides=list(args.set or []),
                             jobs=args.jobs))
        return 0
    print(run_compare(args.methods, seeds, args.out, config_path=args.config, overrides=list(args.set or []),
                      say=_say, baseline=args.baseline, report_only=args.report_only, jobs=args.jobs))
    return 0


def _warmstart(args: argparse.Namespace) -> int:
    from tracerl.policy.embedded import CHECK_SPLIT, build_embedded
    from tracerl.train.policy import embedded_domain, run_limits

    config = _train_config(args)
    if config.policy.model != "embedded":
        raise SystemExit(f"tracerl warmstart builds the embedded policy; this config's policy.model is "
                         f"{config.policy.model!r}")
    embedded, domain, cache = config.policy.embedded, embedded_domain(config), config.policy.cache_dir or None
    if args.search:
        from tracerl.policy import warmstart

        result = warmstart.search(embedded, domain, cache, limits=run_limits(config, embedded.limits()),
                                  num_prompts=args.prompts, seed=args.seed, min_steps=args.min_steps,
                                  max_steps=args.max_steps, num_threads=config.run.num_threads, say=_say)
        _write_table(args.out, warmstart.to_markdown(result), result, config.run.num_threads)
        print(f"train from it with: --set policy.embedded.sft_steps={result['steps']} (its build is cached)")
        return 0 if result["reached"] else 1
    policy = build_embedded(embedded, cache, rebuild=not args.keep, progress=_say, domain=domain)
    m = policy.metrics()
    print(f"embedded policy in {policy.path}: held-out success on the {CHECK_SPLIT} split {m['eval/success']:.1%} ± "
          f"{m['eval/success_se']:.1%} ({m['eval/num_prompts']} questions x "
          f"{m['eval/num_rollouts'] // m['eval/num_prompts']}), built in {m['sys/build_seconds']:.0f} s, weights "
          f"sha256 {m['build/weights_sha256'][:16]}")
    return 0


def _write_table(out: str | None, text: str, result: dict, num_threads: int) -> None:
    """Print a table; with `out`, also OUT.md (the command line and the machine above the table) and OUT.json."""
    import os
    import shlex

    if out:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        command = "tracerl " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        path.with_suffix(".md").write_text(f"`{command}` on a {os.cpu_count()}-core machine, torch threads "
                                           f"{num_threads}\n\n{text}\n")
        path.with_suffix(".json").write_text(json.dumps(_finite(result), indent=1) + "\n")
    print(text)


def _regime(args: argparse.Namespace) -> int:
    from tracerl.bench import regime

    config = _train_config(args)
    result = regime.run(config, args.split, args.prompts, args.samples, args.temperature, args.seed, say=_say)
    _write_table(args.out, regime.to_markdown(result), result, config.run.num_threads)
    return 0


def _verdict(args: argparse.Namespace) -> int:
    from tracerl.report import verdict

    summaries, names = [], []
    for name in args.reports:
        path = Path(name)
        path = path / "compare.json" if path.is_dir() else path
        try:
            summaries.append(json.loads(path.read_text()))
        except (OSError, ValueError) as err:
            raise SystemExit(f"tracerl verdict: cannot read {path} ({err}); give the compare.json that "
                             "tracerl compare wrote, or its folder")
        names.append(path.resolve().parent.name)  # a testbed is named by its report's folder
    try:
        plans = [verdict.Plan(method=args.method, planned_seeds=n, alpha=args.alpha, min_effect=args.min_effect / 100,
                              max_share=args.max_share, goal_share=args.goal_share)
                 for n in verdict.planned_seeds(args.planned_seeds, len(summaries), args.across_testbeds)]
        if args.across_testbeds:
            if len(set(names)) != len(names):
                raise ValueError(f"two reports come from folders of one name ({names}): across testbeds each "
                                 "testbed is named by its report's folder")
            result = verdict.testbed_verdict(dict(zip(names, summaries)), dict(zip(names, plans)))
        else:
            result = verdict.primary_verdict(summaries, plans[0])
    except ValueError as err:
        raise SystemExit(f"tracerl verdict: {err}")
    text = verdict.testbeds_to_markdown(result) if args.across_testbeds else verdict.to_markdown(result)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "primary.md").write_text(text)
        (out / "primary.json").write_text(json.dumps(_finite(result), indent=1) + "\n")
    print(text, end="")
    return 0


def _serve(args: argparse.Namespace) -> int:
    try:
        from tracerl.serve import ServeLimits, run_server
    except ImportError as err:
        raise SystemExit(f"tracerl serve needs fastapi and uvicorn: pip install -e '.[serve]' ({err})")
    run_server(args.model, host=args.host, port=args.port, device=args.device,
               served_model_name=args.served_model_name, num_threads=args.threads, say=_say,
               limits=ServeLimits(max_n=args.max_n, max_samples=args.max_samples, max_tokens=args.max_tokens,
                                  max_body_bytes=int(args.max_body_mb * (1 << 20))))
    return 0


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="a preset (configs/*.toml) or a run's config.json (default: built-in defaults)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a config key, e.g. --set optim.lr=1e-3 --set allocation.k_max=null (repeatable)")


def _methods(args: argparse.Namespace) -> int:
    from tracerl.core.methods import METHODS

    for m in METHODS.values():
        stage2 = m.prefix_policy or "-"
        source = f" [{m.source}]" if m.source else ""
        print(f"{m.name:<22} stage1={m.root_policy:<14} stage2={stage2:<10} adv={m.advantage:<13} "
              f"{m.description}{source}")
    return 0


def _view(args: argparse.Namespace) -> int:
    from tracerl.report.view import serve_file, write_view

    path = write_view(args.run_dir, step=args.step, out=args.out, all_steps=args.all_steps)
    print(path)
    if args.serve:
        serve_file(path, port=args.port, say=_say)
    return 0


def _report(args: argparse.Namespace) -> int:
    from tracerl.report.run_report import write_run_report

    print(write_run_report(args.run_dir))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tracerl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    add_bench_parsers(sub)

    p = sub.add_parser("train", help="train a policy with a method preset (default: trace on the embedded policy)")
    _add_run_options(p)
    p.add_argument("--out", help="run directory (default: runs/{method}-seed{seed})")
    p.add_argument("--resume", action="store_true", help="continue from the run directory's latest checkpoint")
    p.add_argument("--executor", choices=("local", "ray"),
                   help="where rollouts run: in this process, or on Ray workers that are clients of policy.base_url "
                        "(= --set run.executor=...; run.num_workers and run.ray_address set the rest)")
    p.set_defaults(func=_train)

    p = sub.add_parser("eval", help="held-out success of a policy (the run's latest checkpoint with --checkpoint)")
    _add_run_options(p)
    p.add_argument("--out", help="run directory whose checkpoint to evaluate; without --config, its config.json "
                                 "(saved by tracerl train) is the config")
    p.add_argument("--checkpoint", action="store_true", help="load the run directory's latest checkpoint first")
    p.set_defaults(func=_eval)

    p = sub.add_parser("compare", help="several methods at equal budget over seeds: paired differences to a baseline "
                                       "at equal units and equal sampled tokens, Markdown table and PNG plots")
    _add_run_options(p)
    p.add_argument("--methods", default="grpo,pcl,treepo,trace",
                   help="comma-separated method presets; a variant takes overrides in brackets, separated by ';': "
                        "trace[allocation.root_share=0.5;allocation.k_max=2]")
    p.add_argument("--seeds", default="1", help="a count (5: seeds 0..4), a list (0,3) or a range (2-4); runs resume, "
                                                "so a long comparison can be run a few seeds at a time")
    p.add_argument("--baseline", default="grpo", help="the entry the others are paired against")
    p.add_argument("--report-only", action="store_true",
                   help="train nothing: write the report from the seeds already finished for every entry")
    p.add_argument("--status", action="store_true",
                   help="train nothing: runs complete, in progress and not begun, and the time left at --jobs")
    p.add_argument("--jobs", type=int, default=1,
                   help="runs trained at a time, each in its own process with run.num_threads torch threads "
                        "(e.g. the number of cores with the default of one thread); results are the same")
    p.add_argument("--out", default="runs/compare", help="folder for the runs, compare.md and the plots")
    p.set_defaults(func=_compare)

    p = sub.add_parser("warmstart", help="(re)build the embedded policy: tokenizer, tiny Qwen3, supervised warm start")
    _add_run_options(p)
    p.add_argument("--keep", action="store_true", help="load a cached build if there is one instead of rebuilding")
    p.add_argument("--search", action="store_true", help="choose sft_steps: the build leaving the most training "
                   "questions mixed at 8 samples (docs/tasks.md); exit 1 when none reaches a quarter")
    p.add_argument("--min-steps", type=int, default=250, help="smallest sft_steps the search builds (default 250)")
    p.add_argument("--max-steps", type=int, default=8000, help="largest sft_steps the search builds (default 8000)")
    p.add_argument("--prompts", type=int, default=128, help="training questions each candidate samples (128)")
    p.add_argument("--seed", type=int, default=0, help="seed of the search's questions and samples")
    p.add_argument("--out", help="with --search, write the table to OUT.md and the numbers to OUT.json")
    p.set_defaults(func=_warmstart)

    p = sub.add_parser("regime", help="a policy's per-prompt success at n samples: all-fail / mixed / all-success "
                                      "shares, overall and by question type")
    _add_run_options(p)
    p.add_argument("--split", default="train", help="rows to sample: train (default), test or warmup")
    p.add_argument("--prompts", type=int, default=256, help="prompts to sample (default 256)")
    p.add_argument("--samples", type=int, default=8, help="samples per prompt, n (default 8, GRPO's group)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0, help="seed of the rows drawn and of sampling")
    p.add_argument("--out", help="write the table to OUT.md and the numbers to OUT.json")
    p.set_defaults(func=_regime)

    p = sub.add_parser("verdict", help="the pre-registered reading of a method's primary comparisons: Holm over "
                                       "the equal-token tests, each established, refuted or unresolved")
    p.add_argument("reports", nargs="+", help="one compare.json (or its folder) per comparator, all of the same runs "
                                              "(with --across-testbeds: one per testbed, against one comparator)")
    p.add_argument("--method", default="trace", help="the entry whose payoff is tested (default trace)")
    p.add_argument("--planned-seeds", required=True,
                   help="the seed count the power analysis fixed (with --across-testbeds, one per report: 16,45); "
                        "fewer seeds make the reading an interim look")
    p.add_argument("--across-testbeds", action="store_true",
                   help="one report per testbed (named by its folder), the equal-token tests one Holm family; the "
                        "token share listed, not read")
    p.add_argument("--alpha", type=float, default=0.05, help="family-wise level over the equal-token tests (Holm)")
    p.add_argument("--min-effect", type=float, default=0.5,
                   help="smallest gain worth the machinery at equal tokens, in points (default 0.5)")
    p.add_argument("--max-share", type=float, default=0.8, help="largest token share worth the machinery (0.8)")
    p.add_argument("--goal-share", type=float, default=0.7, help="the token share the method is held to (0.7)")
    p.add_argument("--out", help="folder for primary.md and primary.json")
    p.set_defaults(func=_verdict)

    p = sub.add_parser("config", help="every config field of tracerl train: type, default (with --config/--set: "
                                      "that config's value, checked at load), allowed values, doc")
    _add_run_options(p)
    p.set_defaults(func=_config)

    p = sub.add_parser("methods", help="list the method presets")
    p.set_defaults(func=_methods)

    p = sub.add_parser("view", help="a step's rollout trees as one self-contained HTML page")
    p.add_argument("run_dir", help="a run directory written by tracerl train (with run.save_trees=true)")
    p.add_argument("--step", type=int, help="the step to show (default: the last step with saved trees)")
    p.add_argument("--all-steps", action="store_true", help="embed every saved step, with a step selector")
    p.add_argument("--out", help="the HTML file (default: <run>/view-step-NNNNNN.html, or <run>/view-all.html)")
    p.add_argument("--serve", action="store_true", help="serve the page on http://127.0.0.1:PORT/ until Ctrl-C")
    p.add_argument("--port", type=int, default=8765, help="port for --serve (0: any free port)")
    p.set_defaults(func=_view)

    p = sub.add_parser("report", help="a run's report.md with plots: success, effective ratio, calibration, budget")
    p.add_argument("run_dir", help="a run directory written by tracerl train")
    p.set_defaults(func=_report)

    p = sub.add_parser("serve", help="OpenAI-compatible /v1/completions on token ids over TransformersEngine")
    p.add_argument("--model", required=True, help='a local model directory (save_pretrained) or "embedded"')
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", default="cpu", help="torch device of the model, e.g. cuda")
    p.add_argument("--served-model-name", help="the name clients send as `model` (default: --model as given)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default 0: torch's choice); 1 is "
                                                         "fastest for tiny models on a busy machine")
    p.add_argument("--max-n", type=int, default=64, help="most samples per prompt (n) in one request")
    p.add_argument("--max-samples", type=int, default=512, help="most prompts x n in one request (memory bound)")
    p.add_argument("--max-tokens", type=int, default=4096, help="largest max_tokens a request may ask for")
    p.add_argument("--max-body-mb", type=float, default=16, help="largest request body, in MiB")
    p.set_defaults(func=_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    from tracerl.io.files.runlog import RunInUse

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, RunInUse) as err:  # user errors raised at the boundary carry the fix in their message
        print(f"tracerl: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
