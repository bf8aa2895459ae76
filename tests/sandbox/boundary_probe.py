"""Run the boundary programs through a standalone copy of the sandbox as the current (non-root) user and print one
JSON object: the layers, and per program (with every layer on, then with the audit hook off) its output and the
wall-clock span of its call, so that the root test can match its lock watcher's refusals to a program. Started by
test_sandbox_boundaries.py under setpriv; stdlib only.

argv: <folder holding tracerl/io/sandbox/, alone> <folder holding boundaries.py> <targets folder>"""

import json
import sys

sys.path[:0] = sys.argv[1:3]
from tracerl.io import sandbox  # noqa: E402  (the copy in argv[1])
from boundaries import LIMITS, PROGRAMS, now, program  # noqa: E402


def main():
    folder = sys.argv[3]
    limits = sandbox.SandboxLimits(**LIMITS)
    report = {"layers": list(sandbox.run_python("pass").layers), "results": {}}
    for name in sorted(PROGRAMS):
        for disable in ((), ("audit_hook",)):
            start = now()
            result = sandbox.run_python(program(name, folder), limits, _disable=disable)
            report["results"][name + "/hook_off" * bool(disable)] = {
                "start": start, "end": now(), "stdout": result.stdout[-3000:], "stderr": result.stderr[-3000:],
                "error": result.error, "layers": list(result.layers)}
    print(json.dumps(report))


main()
