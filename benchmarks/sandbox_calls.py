"""Sandboxed Python calls: wall time per call (median and p90), this tree against another revision side by side, and
where a call's milliseconds go, stage by stage.

    python benchmarks/sandbox_calls.py [--calls 200] [--threads 1,4] [--baseline HEAD] [--layers] [--no-fresh]
                                       [--out FILE.md]

Every call runs with all the layers this host gives (`tracerl.io.sandbox.run_python`). Workloads: a one-line program
(what the math domain's expert runs: `print(<expression>)`), a short math computation (imports fractions, sums 199
terms), and a program that raises (the traceback path). Per workload and number of callers at once (`--threads`):
the median and p90 of `--calls` calls, each timed on its own.

`--baseline REV` runs the same calls through the sandbox modules of git revision REV (src/tracerl/io/sandbox/,
copied out and run in a second process), alternating blocks of 20 calls between the two so that a change in the
machine's load falls on both. A column for this tree with a fresh interpreter per call (`_fresh=True`, the
fallback without pidfds) comes last unless `--no-fresh`. `--layers` prints, for this tree, the median and p90 of each
stage of a call (from the stamps the caller and the launcher take, `sandbox._clocked`; the program's own end is
stamped by a line the benchmark appends to it). The load average is printed before and after: on a 2-core machine
another process's work shows in every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = {
    "one line": "print(6 * 7 + 5)",
    "short math": "from fractions import Fraction\nprint(sum(Fraction(1, k * k) for k in range(1, 200)))",
    "raise": "def f(n):\n    return 1 // n\nf(0)",
}
BLOCK = 20
# the stages of a call in the order they happen, by the stamp that ends each (`sandbox._clocked`); "launched" (the
# server's reply) overlaps the launcher's first stages and is left out of the chain
STAGES = {
    "prepared": "caller: workdir, cgroups (pool), files, config",
    "launcher": "launch: request, server forks (fresh: interpreter start, imports)",
    "detached": "launcher: session, descriptors, cwd, environment",
    "cgroup": "cgroup attach",
    "namespaces": "user, network, IPC namespaces",
    "mounts": "mount namespace: read-only mounts, tmpfs workdir",
    "pidns": "PID namespace: fork, /proc",
    "rlimits": "rlimits",
    "uid": "uid drop (or capabilities), no_new_privs",
    "landlock": "Landlock",
    "seccomp": "seccomp",
    "program": "audit hook, last checks",
    "program_end": "status written, compile, the program",
    "reaped": "program's exit, its namespace ended",
    "exited": "launcher's exit, seen by the caller",
    "gone": "caller: processes gone, launcher reaped",
    "collected": "caller: output, status, OOM check",
    "returned": "caller: cleanup before returning",
}
END_STAMP = "\nimport sys as _s, time as _t\n_s.stderr.write('@program_end %r\\n' % _t.monotonic())\n"


def time_calls(run, code: str, calls: int, threads: int) -> list[float]:
    """Milliseconds of each of `calls` calls of `run(code)`, `threads` at a time."""
    def one(_):
        start = time.perf_counter()
        result = run(code)
        took = time.perf_counter() - start
        if result.timed_out:
            raise SystemExit(f"a call timed out ({code[:30]!r}): the machine is too loaded to time it")
        return 1000 * took

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(one, range(calls)))


def stats(ms: list[float]) -> tuple[float, float]:
    ordered = sorted(ms)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


class Baseline:
    """The sandbox of another revision, in a worker process of its own (this file with --worker)."""

    def __init__(self, rev: str) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="tracerl-sandbox-baseline-"))
        package = self.folder / "tracerl" / "io"
        package.mkdir(parents=True)
        for folder in (package.parent, package):
            (folder / "__init__.py").touch()
        names = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, "src/tracerl/io/"], cwd=ROOT, check=True,
                               capture_output=True, text=True).stdout.split()
        # io/sandbox*.py before io/ was split into rooms, io/sandbox/*.py after: either imports as tracerl.io.sandbox
        for name in (n for n in names if n.removeprefix("src/tracerl/io/").startswith("sandbox")):
            text = subprocess.run(["git", "show", f"{rev}:{name}"], cwd=ROOT, check=True, capture_output=True).stdout
            target = package / name.removeprefix("src/tracerl/io/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(text)
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", str(self.folder)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def __call__(self, code: str, calls: int, threads: int) -> list[float]:
        self.proc.stdin.write(json.dumps({"code": code, "calls": calls, "threads": threads}) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()
        shutil.rmtree(self.folder)


def worker(folder: str) -> None:
    sys.path.insert(0, folder)
    from tracerl.io.sandbox import run_python

    for line in sys.stdin:
        request = json.loads(line)
        print(json.dumps(time_calls(run_python, request["code"], request["calls"], request["threads"])), flush=True)


def spans_of(stamps: dict[str, float]) -> dict[str, float]:
    """Seconds of each stage of one call: from the stage before it that was stamped to its own stamp."""
    spans, last = {}, stamps["call"]
    for stage in STAGES:
        if stage in stamps:
            spans[stage], last = stamps[stage] - last, stamps[stage]
    return spans


def stage_table(run_python, sandbox, code: str, calls: int) -> list[str]:
    """Median and p90 milliseconds of each stage of `calls` calls of `code` (one at a time)."""
    timelines = []
    sandbox._clocked = timelines.append
    try:
        for _ in range(calls):
            result = run_python(code + END_STAMP)
            stamps = dict(timelines[-1])
            for line in result.stderr.splitlines():
                if line.startswith("@program_end "):
                    stamps["program_end"] = float(line.split()[1])
            timelines[-1] = stamps
    finally:
        sandbox._clocked = None
    rows = []
    spans = [spans_of(stamps) for stamps in timelines]
    for stage, label in STAGES.items():
        if any(stage in s for s in spans):
            median, p90 = stats([1000 * s[stage] for s in spans if stage in s])
            rows.append(f"| {label} | {median:.2f} | {p90:.2f} |")
    totals = [t["returned"] - t["call"] for t in timelines]
    median, p90 = stats([1000 * t for t in totals])
    return rows + [f"| **whole call** | **{median:.2f}** | **{p90:.2f}** |"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200, help="calls per workload and way (median and p90 of these)")
    parser.add_argument("--threads", default="1", help="callers at once, one table row each: 1,4")
    parser.add_argument("--baseline", help="a git revision whose sandbox runs the same calls side by side")
    parser.add_argument("--no-fresh", action="store_true", help="leave out the fresh interpreter per call")
    parser.add_argument("--layers", action="store_true", help="print each stage of a call (this tree)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)
    sys.path.insert(0, str(ROOT / "src"))
    from tracerl.io import sandbox
    from tracerl.io.sandbox import run_python

    load_before = os.getloadavg()
    ways = {"this tree": lambda code, n, t: time_calls(run_python, code, n, t)}
    baseline = Baseline(args.baseline) if args.baseline else None
    if baseline:
        ways = {f"at {args.baseline}": baseline, **ways}
    if not args.no_fresh:
        ways["this tree, fresh interpreter"] = lambda code, n, t: time_calls(
            lambda c: run_python(c, _fresh=True), code, n, t)
    layers = ", ".join(run_python("pass").layers)
    lines = [f"{args.calls} calls per cell; {os.cpu_count()} CPUs ({platform.machine()}), Python "
             f"{platform.python_version()}, uid {os.geteuid()}; layers: {layers}.", "",
             "| workload | callers | " + " | ".join(f"{way}: median ms | p90 ms" for way in ways) + " |",
             "|---|---|" + "---|---|" * len(ways)]
    try:
        for threads in (int(t) for t in args.threads.split(",")):
            for name, code in WORKLOADS.items():
                times = {way: [] for way in ways}
                for way, run in ways.items():
                    run(code, 5, threads)  # warm-up: servers started, caches filled
                while len(times["this tree"]) < args.calls:
                    block = min(BLOCK, args.calls - len(times["this tree"]))
                    for way, run in ways.items():
                        times[way] += run(code, block, threads)
                cells = " | ".join("%.1f | %.1f" % stats(ms) for ms in times.values())
                lines.append(f"| {name} | {threads} | {cells} |")
                print(lines[-1], flush=True)
    finally:
        if baseline:
            baseline.close()
    if args.layers:
        for name in ("one line", "short math"):
            lines += ["", f"Stages of a call, this tree, {name} ({args.calls} calls, ms):", "",
                      "| stage | median | p90 |", "|---|---|---|"]
            lines += stage_table(run_python, sandbox, WORKLOADS[name], args.calls)
    lines += ["", "Load average (1, 5, 15 min): before %.2f %.2f %.2f, after %.2f %.2f %.2f." % (
        *load_before, *os.getloadavg())]
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
