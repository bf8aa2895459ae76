"""verl's own entry point, `python -m verl.trainer.main_ppo`, as a subprocess that cannot outlive its time limit.

A verl run whose rollout worker dies can hang instead of exiting, and killing the driver leaves its Ray workers
running. `run_main_ppo` gives the run its own process group and its own short Ray temporary folder, and on exit, at
`limit_s`, on Ctrl-C or on SIGTERM kills the group and every process whose command line names that folder (Ray's
raylet, GCS, workers). A SIGKILL to the calling process leaves them: nothing runs then. `console_metrics` reads
the metrics verl's console logger printed per step back from the run's output.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from tracerl.integrations.verl_plugin import environment

TIMED_OUT = -9  # the exit code reported for a run killed at its limit
_STEP_LINE = re.compile(r"step:(\d+) - (.*)")
_NUMPY_SCALAR = re.compile(r"^np\.\w+\((.*)\)$")


def run_main_ppo(overrides: Sequence[str], log: Path, *, cwd: Path, limit_s: float, on_cpu: bool = True,
                 env: dict[str, str] | None = None) -> int:
    """Run main_ppo with `overrides` (Hydra's key=value list), its output to `log`; its exit code, or `TIMED_OUT`.
    The plugin's `environment(on_cpu=...)` is set, then `env` on top."""
    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay short
    args = [*overrides, f"+ray_kwargs.ray_init._temp_dir={ray_tmp}"]
    full_env = {**os.environ, **environment(on_cpu=on_cpu), **(env or {})}
    # the run is in a session of its own, so a terminal's Ctrl-C reaches only this process (KeyboardInterrupt, then
    # the cleanup below); a SIGTERM to it is turned into the same exit, so that the cleanup runs then too
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _exit_on_term) if main else None
    try:
        with open(log, "w") as out:
            proc = subprocess.Popen([sys.executable, "-m", "verl.trainer.main_ppo", *args], stdout=out,
                                    stderr=subprocess.STDOUT, env=full_env, cwd=cwd, start_new_session=True)
            try:
                return proc.wait(timeout=limit_s)
            except subprocess.TimeoutExpired:
                return TIMED_OUT
            finally:
                _kill_run(proc, ray_tmp)
                shutil.rmtree(ray_tmp, ignore_errors=True)
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


def _exit_on_term(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _kill_run(proc: subprocess.Popen, ray_tmp: str) -> None:
    import psutil  # Ray's own dependency

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for other in psutil.process_iter(["cmdline"]):
        if any(ray_tmp in part for part in other.info["cmdline"] or ()):
            try:
                other.kill()
            except psutil.Error:
                pass


def console_metrics(output: str) -> dict[int, dict[str, str]]:
    """The metrics verl's console logger printed, per step: {step: {name: value as printed}}."""
    found = {}
    for number, rest in _STEP_LINE.findall(output):
        found[int(number)] = dict(item.split(":", 1) for item in rest.strip().split(" - ") if ":" in item)
    return found


def metric_value(text: str) -> float:
    """A printed metric as a number (verl prints numpy scalars as `np.float64(x)`)."""
    return float(_NUMPY_SCALAR.sub(r"\1", text))
