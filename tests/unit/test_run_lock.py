"""One process trains a run directory at a time: a second holder is refused by name, and a killed holder leaves
no stale lock behind."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tracerl.io.files.runlog import LOCK_FILE, RunInUse, run_lock

HOLD = """
import fcntl, os, sys, time
handle = open(sys.argv[1], "a+")
fcntl.flock(handle, fcntl.LOCK_EX)
handle.seek(0); handle.truncate(); handle.write(str(os.getpid())); handle.flush()
print("held", flush=True)
time.sleep(600)
"""


def test_a_second_holder_in_the_same_process_is_refused_until_the_first_lets_go(tmp_path):
    run = tmp_path / "runs" / "grpo-seed0"
    with run_lock(run):
        assert (run / LOCK_FILE).read_text() == str(os.getpid())
        with pytest.raises(RunInUse, match=f"grpo-seed0 is being trained by another process \\(pid {os.getpid()}\\)"):
            with run_lock(run):
                pass
    with run_lock(run):  # released on leaving the block
        pass


def test_a_lock_of_a_killed_process_is_gone_with_it(tmp_path):
    tmp_path.joinpath(LOCK_FILE).touch()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / LOCK_FILE)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunInUse, match=f"pid {holder.pid}"):
            with run_lock(tmp_path):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    deadline = time.monotonic() + 120  # only stops the wait: the kernel drops the lock with the process's files
    while True:
        try:
            with run_lock(tmp_path):
                break
        except RunInUse:
            assert time.monotonic() < deadline, "timeout: the killed holder's lock outlived it by 120 s"
            time.sleep(0.05)


def test_the_lock_raises_inside_the_block_as_it_would_outside(tmp_path):
    with pytest.raises(KeyError):
        with run_lock(tmp_path):
            raise KeyError("a step that failed")
    with run_lock(tmp_path):  # and is released after it
        pass
