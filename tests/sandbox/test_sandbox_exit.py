"""A sandboxed program ends as `python script.py` ends: non-daemon threads are waited for, atexit functions run,
SystemExit sets the exit code, the program's own objects are finalized (their __del__, a buffered file on stdout)
and the standard streams are flushed; output written at any of these steps reaches the result."""

from __future__ import annotations

import pytest

from tracerl.io.sandbox import SandboxLimits, run_python

PATIENT = SandboxLimits(wall_seconds=30.0)  # the programs end by themselves; a loaded machine must not time them out


@pytest.mark.parametrize("fresh", [False, True], ids=["served", "fresh"])
def test_non_daemon_threads_and_atexit_functions_finish_before_the_call_ends(fresh):
    code = ("import atexit, threading, time\n"
            "atexit.register(print, 'atexit ran')\n"
            "def late():\n"
            "    time.sleep(0.2)\n"
            "    print('thread finished')\n"
            "threading.Thread(target=late).start()\n"
            "print('main done')\n")
    result = run_python(code, PATIENT, _fresh=fresh)
    assert result.ok and result.stdout == "main done\nthread finished\natexit ran\n", result


@pytest.mark.parametrize("fresh", [False, True], ids=["served", "fresh"])
def test_the_programs_objects_are_finalized_and_its_buffers_flushed(fresh):
    code = ("import sys\n"
            "class Noisy:\n"
            "    def __del__(self):\n"
            "        print('finalized', file=sys.stderr)\n"
            "keep = Noisy()\n"
            "out = open(1, 'w', closefd=False, buffering=1 << 16)\n"
            "out.write('buffered, never flushed\\n')\n")
    result = run_python(code, PATIENT, _fresh=fresh)
    assert result.ok and result.stdout == "buffered, never flushed\n" and result.stderr == "finalized\n", result


@pytest.mark.parametrize("code,exit_code,stderr", [
    ("import sys\nsys.exit(3)\n", 3, ""),
    ("import sys\nsys.exit('bye')\n", 1, "bye\n"),
    ("raise SystemExit\n", 0, ""),
    ("import atexit, sys\natexit.register(print, 'atexit ran')\nsys.exit(4)\n", 4, ""),
    ("import os\nos._exit(7)\n", 7, ""),
])
def test_the_exit_code_is_the_programs(code, exit_code, stderr):
    result = run_python(code, PATIENT)
    assert (result.exit_code, result.stderr) == (exit_code, stderr), result
    assert ("atexit ran" in result.stdout) == ("atexit" in code), result


def test_an_exception_still_runs_atexit_functions_and_exits_with_1():
    code = "import atexit\natexit.register(print, 'atexit ran')\nraise ValueError('bad')\n"
    result = run_python(code, PATIENT)
    assert result.exit_code == 1 and result.stdout == "atexit ran\n", result
    assert result.stderr.rstrip().endswith("ValueError: bad"), result
