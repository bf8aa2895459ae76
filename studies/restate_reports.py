"""State every kept comparison report's intervals over seeds again, by the current statistics.

    python studies/restate_reports.py [--check]

Every `studies/**/compare.json` that holds bootstrap intervals is passed through `tracerl.report.restate.restate`
(its intervals over seeds recomputed from its per-seed values) and written back with its compare.md, rendered by
`tracerl.report.compare.to_markdown` with the command its last line records. Prints each report that changed. With
--check nothing is written, and the exit status is 1 if any report would change (the tables are stated by today's
rules when it is 0). Left as written: reports of an earlier format (no bootstrap fields), which hold no interval these
rules changed, and a table's `frozen-tree/` reports, the record of what its frozen tree wrote when it was read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tracerl.report.compare import to_markdown
from tracerl.report.restate import restate

STUDIES = Path(__file__).resolve().parent


def restatable(report: Path) -> bool:
    """A report of the current format (it holds a bootstrap interval) that is not a frozen tree's record."""
    return "frozen-tree" not in report.relative_to(STUDIES).parts and '"boot_lo"' in report.read_text()


def restated(report: Path) -> tuple[str, str]:
    """(compare.json, compare.md) as today's statistics state them."""
    summary = json.loads(report.read_text())
    last = report.with_name("compare.md").read_text().rstrip("\n").splitlines()[-1]
    command = last[last.index("Command: `") + len("Command: `"):-1]
    new = restate(summary)
    return json.dumps(new, indent=1), to_markdown(new, command) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a report would change")
    args = parser.parse_args(argv)
    changed = 0
    for report in sorted(STUDIES.rglob("compare.json")):
        if not restatable(report):
            continue
        text, markdown = restated(report)
        if text != report.read_text() or markdown != report.with_name("compare.md").read_text():
            changed += 1
            print(f"{report.relative_to(STUDIES)}: {'would change' if args.check else 'restated'}")
            if not args.check:
                report.write_text(text)
                report.with_name("compare.md").write_text(markdown)
    print(f"{changed} report(s) {'to restate' if args.check else 'restated'}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
