"""Sandboxed Python calls per second: launchers forked from the warm server against a fresh interpreter per call.

    python benchmarks/sandbox_calls.py [--calls 40] [--threads 1,4] [--out FILE.md]

Every call runs with all the layers this host gives (`tracerl.io.sandbox.run_python`); the two ways differ only in
how the launcher starts (`_fresh=True`: `python -c <launcher>` per call, the old way and the fallback without
pidfds). Workloads: an empty program, a short computation that prints (what a math tool call looks like), and a
program that raises (the traceback path). Per workload and thread count: milliseconds per call (wall clock over the
batch divided by the calls) both ways, and their ratio. Each pair is run alternately, after one warm-up call each.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tracerl.io.sandbox import run_python

WORKLOADS = {
    "empty": "pass",
    "compute and print": "from fractions import Fraction\nprint(sum(Fraction(1, k * k) for k in range(1, 200)))",
    "raise": "def f(n):\n    return 1 // n\nf(0)",
}


def ms_per_call(code: str, calls: int, threads: int, fresh: bool) -> float:
    run_python(code, _fresh=fresh)
    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(lambda _: run_python(code, _fresh=fresh), range(calls)))
    seconds = time.perf_counter() - start
    if any(r.timed_out for r in results):
        raise SystemExit(f"a call timed out ({code[:30]!r}): the machine is too loaded to time it")
    return 1000 * seconds / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--threads", default="1,4")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    layers = ", ".join(run_python("pass").layers)
    lines = [f"{args.calls} calls per cell; {os.cpu_count()} CPUs ({platform.machine()}), Python "
             f"{platform.python_version()}; layers: {layers}.", "",
             "| workload | threads | fresh interpreter, ms/call | forked from the server, ms/call | ratio |",
             "|---|---|---|---|---|"]
    for threads in (int(t) for t in args.threads.split(",")):
        for name, code in WORKLOADS.items():
            fresh = ms_per_call(code, args.calls, threads, fresh=True)
            served = ms_per_call(code, args.calls, threads, fresh=False)
            lines.append(f"| {name} | {threads} | {fresh:.1f} | {served:.1f} | {served / fresh:.2f}x |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
