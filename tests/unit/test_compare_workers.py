"""`tracerl compare --jobs N`'s worker processes end with the comparing process, however it ends: a killed
comparison leaves no orphan training a run that a resumed comparison would train beside it."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from helpers import process_alive

PARENT = textwrap.dedent("""
    import multiprocessing, os, sys, time
    from concurrent.futures import ProcessPoolExecutor
    from tracerl.train.compare import _die_with_parent

    def hold(path):
        with open(path, "w") as f:
            f.write(str(os.getpid()))
        time.sleep(600)

    if __name__ == "__main__":
        pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_die_with_parent, initargs=(os.getpid(),))
        pool.submit(hold, sys.argv[1])
        time.sleep(600)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_worker_dies_when_the_comparing_process_is_killed(tmp_path):
    script, marker = tmp_path / "parent.py", tmp_path / "worker.pid"
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, script, marker])
    try:
        deadline = time.monotonic() + 120  # a spawned worker imports tracerl: slow on a loaded machine
        while not (marker.exists() and marker.read_text()) and time.monotonic() < deadline:
            assert parent.poll() is None, "the parent ended on its own"
            time.sleep(0.1)
        worker = int(marker.read_text())
        assert process_alive(worker)
        os.kill(parent.pid, signal.SIGKILL)  # no handler runs: only the kernel can end the worker
        parent.wait()
        deadline = time.monotonic() + 60
        while process_alive(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not process_alive(worker), "the worker outlived the killed comparison"
    finally:
        parent.kill()
        if marker.exists() and marker.read_text() and process_alive(int(marker.read_text())):
            os.kill(int(marker.read_text()), signal.SIGKILL)
