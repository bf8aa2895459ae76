"""Run the hostile programs through a standalone copy of the sandbox as the current (non-root) user and print one
JSON object: per program, whether it was contained, with every layer on and with the audit hook off; and whether a
thread hog in one sandbox starves another. Started by test_sandbox_nonroot.py under setpriv; stdlib only.

argv: <folder holding tracerl/io/sandbox/, alone> <folder holding hostile.py>"""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time

sys.path[:0] = sys.argv[1:3]
from tracerl.io import sandbox  # noqa: E402  (the copy in argv[1])
from hostile import HARDENING, NEEDS_THREADS, THREAD_HOG, Host  # noqa: E402

started = []



def survivors():
    found = [f"workdir {wd}" for wd in started if os.path.exists(wd)]
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state != b"Z" and any(wd in cmdline for wd in started):
            found.append(f"pid {entry}: {cmdline[:60]!r}")
    return found


def main():
    sandbox._launched = lambda pid, workdir: started.append(workdir)
    outside = tempfile.mkdtemp(prefix="outside-")
    os.chmod(outside, 0o777)
    with open(os.path.join(outside, "secret.txt"), "w") as f:
        f.write("the answer is 42")
    os.chmod(os.path.join(outside, "secret.txt"), 0o600)  # the caller's own file: only the sandbox keeps it safe
    victim = subprocess.Popen(["sleep", "60"])  # same user as the sandbox: only its layers protect it
    host = Host(outside, victim.pid)
    os.chmod(host.sock, 0o600)  # the caller's own socket, like a trainer's
    host.modes = host._modes()
    limits = sandbox.SandboxLimits(wall_seconds=2.0, memory_mb=256)
    report = {"layers": list(sandbox.run_python("pass").layers), "results": {}}
    for name, code in sorted(HARDENING.items()):
        for disable in ((), ("audit_hook",)):
            result = sandbox.run_python(code.format(**host.fields()), limits, _disable=disable)
            problems = survivors() + host.problems(result.stdout)
            host.reset()
            if victim.poll() is not None:
                problems.append("killed the victim")
                victim = subprocess.Popen(["sleep", "60"])
            if result.ok:
                problems.append("reported ok")
            report["results"][name + "/hook_off" * bool(disable)] = {
                "problems": problems, "error": result.error, "stderr": result.stderr[-300:],
                "stdout": result.stdout[:300]}
    report["threads"] = threads_side_by_side()
    normal = sandbox.run_python("print(sum(range(10)))")
    report["normal"] = normal.stdout
    victim.kill()
    host.close()
    print(json.dumps(report))


def threads_side_by_side():
    """What a sandbox needing eight threads printed while another held every thread it could."""
    hog = []
    limits = sandbox.SandboxLimits(wall_seconds=6.0, max_processes=64)
    thread = threading.Thread(target=lambda: hog.append(sandbox.run_python(THREAD_HOG, limits,
                                                                           _disable=("audit_hook",))))
    thread.start()
    time.sleep(2.5)
    other = sandbox.run_python(NEEDS_THREADS, sandbox.SandboxLimits(wall_seconds=3.0), _disable=("audit_hook",))
    thread.join()
    return {"hog": hog[0].stdout[:40], "other": other.stdout + other.stderr[-300:]}


main()
