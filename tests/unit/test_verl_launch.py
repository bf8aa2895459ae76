"""`tracerl.integrations.verl_plugin.launch.run_main_ppo` ends its run however the caller ends: at its limit, or on
SIGTERM to the caller, the run's whole process group is killed. verl is not needed: a stand-in `verl.trainer.main_ppo`
on PYTHONPATH that records its pid and sleeps plays the run (what is tested is the process handling, not verl)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from helpers import process_alive
from tracerl.integrations.verl_plugin.launch import TIMED_OUT, console_metrics, metric_value, run_main_ppo

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups and /proc: Linux")

SLEEPER = "import os, sys, time\nopen(os.environ['STUB_PID'], 'w').write(str(os.getpid()))\ntime.sleep(600)\n"


@pytest.fixture
def stand_in(tmp_path):
    trainer = tmp_path / "stub" / "verl" / "trainer"
    trainer.mkdir(parents=True)
    for folder in (trainer.parent, trainer):
        (folder / "__init__.py").write_text("")
    (trainer / "main_ppo.py").write_text(SLEEPER)
    return {"PYTHONPATH": str(tmp_path / "stub"), "STUB_PID": str(tmp_path / "run.pid")}


def wait_for(check, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds  # generous: a loaded machine starts Python slowly
    while not check():
        assert time.monotonic() < deadline, f"timeout: {what}"
        time.sleep(0.1)


def running_with(marker: str) -> list[int]:
    """Live processes whose command line holds `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker.encode() in f.read() and process_alive(int(entry)):
                        found.append(int(entry))
            except OSError:
                pass
    return found


def test_a_run_past_its_limit_is_killed_and_reported(stand_in, tmp_path):
    marker = f"marker={tmp_path}"  # on the run's command line, however far it got in 3 s on a slow machine
    code = run_main_ppo([marker], tmp_path / "log.txt", cwd=tmp_path, limit_s=3, env=stand_in)  # it sleeps 600 s
    assert code == TIMED_OUT
    assert running_with(marker) == [], "the run outlived its limit"


def test_a_sigterm_to_the_caller_kills_the_run(stand_in, tmp_path):
    caller = tmp_path / "caller.py"
    caller.write_text(textwrap.dedent(f"""
        import json, pathlib, sys
        from tracerl.integrations.verl_plugin.launch import run_main_ppo
        run_main_ppo([], pathlib.Path(sys.argv[1]), cwd=pathlib.Path(sys.argv[2]), limit_s=600,
                     env=json.loads(sys.argv[3]))
    """))
    import json

    proc = subprocess.Popen([sys.executable, caller, tmp_path / "log.txt", tmp_path, json.dumps(stand_in)])
    try:
        wait_for(lambda: os.path.exists(stand_in["STUB_PID"]) and open(stand_in["STUB_PID"]).read(), 120,
                 "the run never started")
        pid = int(open(stand_in["STUB_PID"]).read())
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        wait_for(lambda: not process_alive(pid), 60, "the run outlived its caller's SIGTERM")
    finally:
        proc.kill()


def test_verls_console_metrics_are_read_back_per_step():
    output = ("(TaskRunner pid=1) step:2 - actor/grad_norm:np.float64(0.25) - alloc/num_prompts:6 - note:a:b\n"
              "unrelated line\nstep:3 - training/global_step:3\n")
    logged = console_metrics(output)
    assert sorted(logged) == [2, 3] and logged[2]["note"] == "a:b"
    assert metric_value(logged[2]["actor/grad_norm"]) == 0.25 and metric_value(logged[3]["training/global_step"]) == 3
