"""Run the hostile programs through a standalone copy of the sandbox as the current (non-root) user and print one
JSON object: per program, whether it was contained. Started by test_sandbox_nonroot.py under setpriv; stdlib only.

argv: <folder holding sandbox.py and sandbox_child.py> <folder holding hostile.py>"""

import json
import os
import subprocess
import sys
import tempfile

sys.path[:0] = sys.argv[1:3]
import sandbox  # noqa: E402  (the copy in argv[1])
from hostile import HARDENING  # noqa: E402

started = []


class Recording(subprocess.Popen):
    def __init__(self, args, *rest, **kwargs):
        super().__init__(args, *rest, **kwargs)
        if "-c" in args and args[args.index("-c") + 1] == sandbox._LAUNCHER:
            started.append(json.loads(args[-1])["workdir"])


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
    sandbox.subprocess.Popen = Recording
    outside = tempfile.mkdtemp(prefix="outside-")
    os.chmod(outside, 0o777)
    with open(os.path.join(outside, "secret.txt"), "w") as f:
        f.write("the answer is 42")
    victim = subprocess.Popen(["sleep", "60"])  # same user as the sandbox: only its layers protect it
    limits = sandbox.SandboxLimits(wall_seconds=2.0, memory_mb=256)
    report = {"layers": list(sandbox.run_python("pass").layers), "results": {}}
    for name, code in sorted(HARDENING.items()):
        result = sandbox.run_python(code.format(dir=outside, pid=victim.pid), limits)
        problems = survivors()
        if sorted(os.listdir(outside)) != ["secret.txt"]:
            problems.append("wrote outside")
        if "42" in result.stdout or "pwned-by-shell" in result.stdout:
            problems.append("got through: " + result.stdout[:80])
        if victim.poll() is not None:
            problems.append("killed the victim")
        if result.ok:
            problems.append("reported ok")
        report["results"][name] = {"problems": problems, "error": result.error, "stderr": result.stderr[-300:]}
    normal = sandbox.run_python("print(sum(range(10)))")
    report["normal"] = normal.stdout
    victim.kill()
    print(json.dumps(report))


main()
