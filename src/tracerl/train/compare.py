"""`tracerl compare`: train several methods (or variants of one) on the same seeds, then write the report.

Each (entry, seed) is one ordinary run (`run_training`) in `<out>/<label>-seed<seed>/` with the same config apart
from the entry's method and overrides, so every entry gets the same steps, per-step budget, data order and
held-out questions. An entry is a method preset (`trace`) or a variant with its own overrides in brackets,
separated by ';' (`trace[allocation.root_share=0.5;allocation.k_max=2]`): the budget-shape and ablation tables
are comparisons of variants. Runs resume, so a long comparison can be run in pieces (`--seeds 0,1` today,
`--seeds 2-4` tomorrow) and `--report-only` writes the report from whatever seeds are complete.

The step-0 evaluation does not depend on the method (same policy, questions and sampling seed), so it is run
once per seed and shared. With `jobs` > 1 the runs go to that many worker processes, seed by seed in the order of
the sequential loop; each run then makes its own step-0 evaluation (the same numbers: same policy, questions and seed),
and a run that fails is reported at the end without stopping the others. A run another process is training (an
overlapping invocation on the same folder: `tracerl.io.files.runlog.run_lock`) is skipped with a message, so two
invocations over the same seeds share the work instead of interleaving one run's steps. The report itself (paired
differences, equal-token reading, plots) is `tracerl.report.compare`.

Before a run's first step its starting weights are hashed and recorded with the machine in `<run>/provenance.json`
(`tracerl.policy.embedded.run_provenance`); the report refuses to pair runs whose starting weights differ. A run
begun without that record (an older run) stays without it, and the report counts it as unchecked.

Dense curves: `--set run.eval_every=2` evaluates every 2 steps on `run.eval_prompts` questions, the same questions
for every entry of a seed. `studies/preregistration.md` sizes the question count from the spread of a question's
success, and the report's resolution line gives that spread for the next comparison.

`--status` trains nothing and says how far a comparison is: per entry the runs complete, in progress (at which
step) and not begun, and the time left, estimated from the seconds the complete runs logged (their steps and
evaluations; the median run, so a run slowed by a paused or shared machine does not set the pace).
"""

from __future__ import annotations

import multiprocessing
import os
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from tracerl.io.env.user_code import kill_with_parent
from tracerl.io.files.boundary import parse_int
from tracerl.io.files.runlog import RunInUse, read_metrics
from tracerl.report.compare import complete_seeds, run_dir_name, seed_spans, write_report
from tracerl.train.config import load_config
from tracerl.train.trainer import run_training

Say = Callable[[str], None]


def parse_entries(text: str) -> list[tuple[str, str, list[str]]]:
    """"grpo,trace[allocation.root_share=0.5;allocation.k_max=2]" -> [(label, method, overrides), ...]."""
    entries, depth, current = [], 0, ""
    for char in text + ",":
        if char == "," and depth == 0:
            if current.strip():
                entries.append(current.strip())
            current = ""
            continue
        depth += (char == "[") - (char == "]")
        if depth < 0:
            raise ValueError(f"--methods {text!r}: a ']' without its '['")
        current += char
    if depth:
        raise ValueError(f"--methods {text!r}: a '[' without its ']'")
    out = []
    for entry in entries:
        method, _, rest = entry.partition("[")
        overrides = [o.strip() for o in rest.rstrip("]").split(";") if o.strip()] if rest else []
        if rest and not entry.endswith("]"):
            raise ValueError(f"--methods entry {entry!r}: overrides go in brackets at the end, e.g. "
                             "trace[allocation.root_share=0.5]")
        bad = [o for o in overrides if "=" not in o]
        if bad:
            raise ValueError(f"--methods entry {entry!r}: {bad} are not key=value overrides")
        out.append((entry, method.strip(), overrides))
    labels = [label for label, _, _ in out]
    if len(set(labels)) != len(labels):
        raise ValueError(f"--methods {text!r} names an entry twice")
    return out


def parse_seeds(text: str) -> list[int]:
    """"5" -> seeds 0..4 (a count); "0,3" or "2-4" -> those seeds."""
    text = str(text).strip()
    usage = f"--seeds {text[:40]!r}: give a count (5), a list (0,3) or a range (2-4)"
    if "," not in text and "-" not in text:
        count = parse_int(text, usage + "; the count", ValueError)
        if count < 1:
            raise ValueError(f"--seeds {text}: give a count >= 1, or a list such as 0,3 or 2-4")
        return list(range(count))
    seeds: list[int] = []
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        first = parse_int(lo, usage + "; a seed", ValueError)
        last = parse_int(hi, usage + "; a range's end", ValueError) if sep else first
        seeds += list(range(first, last + 1))
    return sorted(set(seeds))


def format_seeds(seeds: Sequence[int]) -> str:
    """What `parse_seeds` reads back as `seeds`: a list, and one seed k as the range "k-k" ("k" alone is a count)."""
    seeds = sorted(set(seeds))
    return f"{seeds[0]}-{seeds[0]}" if len(seeds) == 1 else ",".join(map(str, seeds))


def describe_seeds(seeds: Sequence[int]) -> str:
    """The seeds in words for a log line, ranges collapsed: "seeds 0-39 (40)", "seed 40", "seeds 0-2, 7 (4)". A
    bare number on the command line is a count, so this line is where a slip ("40" for seed 40) shows."""
    seeds = sorted(set(seeds))
    return f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {', '.join(seed_spans(seeds))} ({len(seeds)})"


def run_compare(methods: str | Sequence[str], seeds: Sequence[int], out: str | Path, *, config_path: str | None = None,
                overrides: Sequence[str] = (), say: Say = print, baseline: str = "grpo",
                report_only: bool = False, all_seeds: Sequence[int] | None = None, jobs: int = 1) -> str:
    """Train every entry on every seed in `seeds` (or finish what is there), `jobs` runs at a time, then write and
    return the report over `all_seeds` (default: `seeds`), using the seeds complete for every entry."""
    if jobs < 1:
        raise ValueError(f"--jobs {jobs}: give 1 (one run at a time) or more")
    out = Path(out)
    entries = parse_entries(methods if isinstance(methods, str) else ",".join(methods))
    if not entries:
        raise ValueError("--methods is empty; name at least one preset, e.g. --methods grpo,trace")
    configs = {(label, s): load_config(config_path, [*overrides, *extra, f"method={method}", f"run.seed={s}",
                                                     f"run.out_dir={out / run_dir_name(label, s)}",
                                                     "run.progress=false"])
               for s in seeds for label, method, extra in entries}  # every config is checked before the first run
    busy: list[str] = []  # runs another process is training: left to it
    if not report_only:
        say(f"compare: {', '.join(label for label, _, _ in entries)} on {describe_seeds(seeds)}: {len(configs)} runs")
    if not report_only and jobs > 1:
        busy = _train_in_parallel(configs, jobs, say)
    elif not report_only:
        for s in seeds:
            initial = None
            for label, _, _ in entries:
                say(f"compare: {label}, seed {s}")
                try:
                    result = run_training(configs[(label, s)], resume=True, say=say, initial_eval=initial)
                except RunInUse as error:
                    say(f"  skipped: {error}")
                    busy.append(run_dir_name(label, s))
                    continue
                initial = result["before"]
                say(f"  held-out success {result['before']['eval/success']:.1%} -> "
                    f"{result['after']['eval/success']:.1%}")
    labels, report_seeds = [label for label, _, _ in entries], list(all_seeds or seeds)
    command = (f"tracerl compare --methods {shlex.quote(','.join(labels))} --seeds {format_seeds(report_seeds)}"
               + (f" --config {config_path}" if config_path else "")
               + "".join(f" --set {shlex.quote(o)}" for o in overrides) + f" --baseline {baseline}")
    if busy and not complete_seeds(out, labels, report_seeds)[0]:
        return (f"no report yet: {', '.join(busy)} {'is' if len(busy) == 1 else 'are'} being trained by another "
                "process, and no seed is complete for every entry; rerun with --report-only when it ends")
    return write_report(out, labels, report_seeds, baseline, command, say)


def _train_one(config) -> tuple[float, float] | str:
    """One run of a parallel comparison, in a worker process: (held-out success before, after), or why it was
    skipped (another process trains it)."""
    prefix = f"[{Path(config.run.out_dir).name}] "
    try:
        result = run_training(config, resume=True, say=lambda message: print(prefix + message, flush=True))
    except RunInUse as busy:
        return str(busy)
    return result["before"]["eval/success"], result["after"]["eval/success"]


def _die_with_parent(parent: int) -> None:
    """A worker's initializer: the kernel kills the worker when the comparing process ends, however it ends
    (`kill_with_parent`), so a killed `tracerl compare` leaves no orphan training on; a resumed comparison would
    otherwise train the same run beside it. Where the kernel cannot be asked, a worker outlives a killed parent."""
    if kill_with_parent() and os.getppid() != parent:  # the parent was gone before the request took effect
        os._exit(1)


def _train_in_parallel(configs: dict, jobs: int, say: Say) -> list[str]:
    """Every (label, seed) run of `configs` in `jobs` worker processes (spawned: no torch state is forked); returns
    the runs skipped because another process trains them."""
    from concurrent.futures import ProcessPoolExecutor, as_completed

    failed, busy = [], []
    say(f"compare: {len(configs)} runs, {jobs} at a time")
    # workers are started from this thread (by submit), whose end PR_SET_PDEATHSIG watches: the process's main thread
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_die_with_parent, initargs=(os.getpid(),)) as pool:
        futures = {pool.submit(_train_one, config): key for key, config in configs.items()}
        for future in as_completed(futures):
            label, seed = futures[future]
            try:
                result = future.result()
            except Exception as error:  # one broken run must not cost the others; all are named below
                failed.append(f"{label} seed {seed}: {type(error).__name__}: {error}")
                say(f"compare: {label}, seed {seed} FAILED: {error}")
                continue
            if isinstance(result, str):
                say(f"compare: {label}, seed {seed} skipped: {result}")
                busy.append(run_dir_name(label, seed))
            else:
                say(f"compare: {label}, seed {seed}: held-out success {result[0]:.1%} -> {result[1]:.1%}")
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(configs)} runs failed (the others are saved and resume):\n  "
                           + "\n  ".join(failed))
    return busy


def compare_status(methods: str, seeds: Sequence[int], out: str | Path, *, config_path: str | None = None,
                   overrides: Sequence[str] = (), jobs: int = 1) -> str:
    """How far the comparison in `out` is (see the module docstring), as a Markdown table with one summary line."""
    out = Path(out)
    labels = [label for label, _, _ in parse_entries(methods)]
    run_config = load_config(config_path, list(overrides)).run
    rows, seconds, num_done, left = [], [], 0, 0.0
    for label in labels:
        done, running, waiting = 0, [], []
        for seed in seeds:
            path = out / run_dir_name(label, seed) / "metrics.jsonl"
            logged = read_metrics(path.parent) if path.exists() else []
            steps = [r for r in logged if r["kind"] == "train"]
            step, tokens = (steps[-1]["step"], steps[-1].get("rollout/cum_tokens", 0.0)) if steps else (0, 0.0)
            if run_config.finished(step, tokens):
                done += 1
                seconds.append(sum(r.get("sys/step_seconds", 0.0) for r in steps)
                               + sum(r.get("eval/seconds", 0.0) for r in logged if r["kind"] == "eval"))
            elif logged:
                running.append(f"{seed} (step {step})")
                left += 1 - run_config.fraction_done(step, tokens)
            else:
                waiting.append(seed)
        num_done, left = num_done + done, left + len(waiting)
        rows.append(f"| {label} | {done} of {len(seeds)} | {', '.join(running) or '-'} | {_spans(waiting)} |")
    summary = f"{num_done} of {len(labels) * len(seeds)} runs complete"
    if seconds and left:
        per_run = float(np.median(seconds))
        summary += (f"; about {left * per_run / jobs / 3600:.1f} h left at {jobs} run(s) at a time (median complete "
                    f"run {per_run / 60:.1f} min, steps and evaluations as logged)")
    elif left:
        summary += "; no complete run yet to estimate the time left from"
    return "\n".join([f"{summary}.", "", "| entry | complete | in progress | not begun |", "|---|---|---|---|", *rows])


def _spans(seeds: Sequence[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8"; "-" for none."""
    spans: list[list[int]] = []
    for seed in sorted(seeds):
        if spans and seed == spans[-1][1] + 1:
            spans[-1][1] = seed
        else:
            spans.append([seed, seed])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in spans) or "-"
