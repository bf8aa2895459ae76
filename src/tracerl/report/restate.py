"""A comparison report's intervals over seeds stated again from the per-seed values it keeps.

`tracerl compare` writes every reading over seeds with its per-seed values (`compare.json`), and every interval over
seeds is a function of them alone: the Student-t interval, the bootstrap over seeds (`core.stats.bootstrap_over_seeds`,
the same draws `seed_bootstrap` makes) and the learning-signal intervals. `restate` recomputes them with the current
statistics, so a table whose runs are not kept is read by today's rules and comes out as `tracerl compare
--report-only` over its runs would write it (a test holds the two equal on a kept archive). Readings on one seed
(intervals over questions) need the runs and stay as written.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from tracerl.core.stats import bootstrap_over_seeds, seed_mean, t_half_width
from tracerl.io.files.runlog import finite
from tracerl.report import compare


def restate(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary with every interval over seeds computed again from the per-seed values it keeps, by the current
    statistics: what `_against_baseline` writes from the runs, for a report whose runs are not at hand. Values read
    on one seed (intervals over questions) and every other field stay as they are."""
    out = copy.deepcopy(summary)
    for row in out["methods"].values():  # the baseline's row too: its share of its own cost is read per seed
        for axis in ("units", "tokens"):
            diff = row.get(f"diff_at_equal_{axis}")
            if diff and len(diff["per_seed"]) >= 2:
                half = t_half_width(diff["per_seed"])
                boot = bootstrap_over_seeds(diff["per_seed"], num_resamples=compare.NUM_RESAMPLES)
                diff.update({"lo": diff["mean"] - half, "hi": diff["mean"] + half, "boot_lo": boot.lo,
                             "boot_hi": boot.hi})
            ci = row.get(f"share_of_baseline_{axis}_ci")
            if ci and len(ci["per_seed"]) >= 2:
                share = bootstrap_over_seeds([math.inf if v is None else v for v in ci["per_seed"]],
                                             num_resamples=compare.NUM_RESAMPLES)
                ci.update({"lo": finite(share.lo), "hi": finite(share.hi), "median_lo": finite(share.median_lo),
                           "median_hi": finite(share.median_hi)})
        for reading in row.get("signal_vs_baseline", {}).values():  # per-seed values as kept: finite ones only
            est = seed_mean(reading["per_seed"])
            reading.update({"lo": finite(est.lo), "hi": finite(est.hi)})
    return out
