"""Check that a newer tree's comparison report holds every number an older tree's report held.

    python studies/same_report.py OLD/compare.json NEW/compare.json [--rtol 1e-9]

A pre-registered table is trained from a frozen tree; its report may be written by a later tree that only adds
readings (`studies/preregistration.md`, amendment 5). This says whether that is so: every field of OLD is in NEW
with the same value (numbers equal to within `rtol` relative or 1e-15 absolute: float rounding, not a different
reading), and it lists the fields NEW adds. Exit 0 when every field of OLD matches, 1 otherwise (each mismatch
printed with its path), 2 when a file cannot be read.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

ABS_TOL = 1e-15


def differences(old: Any, new: Any, rtol: float = 1e-9, path: str = "") -> tuple[list[str], list[str]]:
    """(mismatches, additions): the paths where NEW lacks or changes a value of OLD, and the paths only NEW has."""
    if isinstance(old, dict) and isinstance(new, dict):
        mismatches, added = [], [f"{path}/{k}" for k in new if k not in old]
        for key, value in old.items():
            if key not in new:
                mismatches.append(f"{path}/{key}: missing from the new report")
                continue
            m, a = differences(value, new[key], rtol, f"{path}/{key}")
            mismatches += m
            added += a
        return mismatches, added
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return [f"{path}: {len(old)} items, now {len(new)}"], []
        mismatches, added = [], []
        for i, (a, b) in enumerate(zip(old, new)):
            m, extra = differences(a, b, rtol, f"{path}[{i}]")
            mismatches += m
            added += extra
        return mismatches, added
    if _is_number(old) and _is_number(new):
        same = (math.isnan(old) and math.isnan(new)) or math.isclose(old, new, rel_tol=rtol, abs_tol=ABS_TOL)
        return ([] if same else [f"{path}: {old!r}, now {new!r}"]), []
    same = type(old) is type(new) and old == new  # True is not 1, None is not 0
    return ([] if same else [f"{path}: {old!r}, now {new!r}"]), []


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", help="compare.json written by the tree the runs were trained with")
    parser.add_argument("new", help="compare.json written by the later tree, over the same runs")
    parser.add_argument("--rtol", type=float, default=1e-9, help="relative tolerance for numbers (default 1e-9)")
    args = parser.parse_args(argv)
    try:
        old, new = (json.loads(open(p).read()) for p in (args.old, args.new))
    except (OSError, ValueError) as err:
        print(f"same_report: {err}", file=sys.stderr)
        return 2
    mismatches, added = differences(old, new, args.rtol)
    for line in mismatches:
        print(f"differs: {line}")
    keys = sorted({p.rsplit("/", 1)[-1] for p in added})
    print(f"{'same' if not mismatches else 'NOT the same'}: {len(mismatches)} field(s) of the old report differ; "
          f"the new one adds {len(added)} field(s) ({', '.join(keys) or 'none'})")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
