"""Run the carry-over programs (`carryover.py`) through a standalone copy of the sandbox as the current (non-root)
user and print one JSON object: per LOOK program, what it printed before and after LEAVE ran, and the layers. Started
by test_sandbox_nonroot.py under setpriv; stdlib only.

argv: <folder holding tracerl/io/sandbox/, alone> <folder holding carryover.py>"""

import json
import sys

sys.path[:0] = sys.argv[1:3]
from tracerl.io import sandbox  # noqa: E402  (the copy in argv[1])
from carryover import LEAVE, LOOK  # noqa: E402

LIMITS = sandbox.SandboxLimits(wall_seconds=30.0, max_output_chars=20_000)


def look(name):
    result = sandbox.run_python(LOOK[name], LIMITS)
    return {"stdout": result.stdout, "error": result.observation() if not result.ok else None,
            "layers": list(result.layers)}


def main():
    report = {}
    for name in sorted(LOOK):
        before = look(name)
        left = sandbox.run_python(LEAVE, LIMITS)
        report[name] = {"before": before, "after": look(name), "leave": left.observation()[-300:],
                        "leave_ok": left.exit_code == 0 and not left.timed_out}
    print(json.dumps(report))


main()
