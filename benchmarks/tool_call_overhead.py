"""What a tool call costs under each `UserTask.tool_isolation`, measured side by side in one run, and what a child
forked for each call (the design `tracerl.io.env.user_code` did not take) would cost in the same process.

A trivial tool (`echo`) is called through `UserTaskEnv.step`, as the driver calls it: with "process" the call goes to
a long-lived worker process (killable at its deadline), with "thread" it runs in a thread of this process (not
killable). Forking costs more in a large process (page tables to copy), so the process is measured bare, then with
torch and transformers imported, then with `--resident-gb` of memory touched, as a trainer holds its model.

    python benchmarks/tool_call_overhead.py [--calls 200] [--resident-gb 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from tracerl.io.env.task import UserTask, UserTaskDomain, json_call


def echo(text: str) -> str:
    """Say the text back.

    Args:
        text: what to say
    """
    return text


def score(data_source, solution_str, ground_truth, extra_info=None):
    return 0.0


def per_call_ms(isolation: str, calls: int, rows: str) -> float:
    """Median milliseconds of one `step` with a tool call, over `calls` calls after 5 warm-up calls."""
    domain = UserTaskDomain(UserTask(tools=[echo], compute_score=score, train_files=[rows],
                                     tool_isolation=isolation))
    env = domain.make_env()
    env.reset(domain.rows("train", 1)[0])
    action = json_call("echo", {"text": "hello"})
    times = []
    for number in range(calls + 5):
        started = time.perf_counter()
        result = env.step(action)
        if number >= 5:
            times.append(time.perf_counter() - started)
        assert result.observation == "hello", result.observation
    return 1000 * statistics.median(times)


def fork_per_call_ms(calls: int) -> float:
    """Median milliseconds of a bare fork, a short answer through a pipe and a wait: a child per call at the least."""
    times = []
    for number in range(calls + 5):
        started = time.perf_counter()
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(write_fd, b"hello")
            os._exit(0)
        os.close(write_fd)
        os.read(read_fd, 16)
        os.close(read_fd)
        os.waitpid(pid, 0)
        if number >= 5:
            times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--resident-gb", type=float, default=2.0)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp())
    rows = folder / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": [{"role": "user", "content": "q"}], "reward_model": {"ground_truth": "1"}})
                    + "\n")
    report = {}

    def measure(label: str) -> None:
        thread, process = per_call_ms("thread", args.calls, str(rows)), per_call_ms("process", args.calls, str(rows))
        forked = fork_per_call_ms(args.calls)
        report[label] = {"thread_ms": round(thread, 3), "process_ms": round(process, 3),
                         "fork_per_call_ms": round(forked, 3)}
        print(f"{label:>30}: thread {thread:6.3f} ms  process {process:6.3f} ms  (a fork per call: {forked:7.3f} ms)",
              flush=True)

    measure("bare interpreter")
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
        measure("torch + transformers imported")
    except ImportError:
        print("torch or transformers not installed: that row is skipped")
    if args.resident_gb > 0:
        held = np.ones(int(args.resident_gb * 2**30 // 8))  # touched, so resident
        measure(f"+ {args.resident_gb:g} GiB resident")
        del held
    print(json.dumps(report))


if __name__ == "__main__":
    main()
