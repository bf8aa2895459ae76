"""Which runs a comparison may pair: each run's `provenance.json` (written before its first step by
`tracerl.policy.embedded.write_provenance`: the starting weights' hash, the code's hash, the machine), read here.

Runs whose starting weights differ are refused with their names: their differences would mix the methods with the
builds. Runs of different code or on different machines are paired, and the report's provenance sentence names
every code hash and machine the runs recorded, so a table that ran across a code change says so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tracerl.io.files import read_utf8
from tracerl.io.files.run_folder import run_path
from tracerl.io.files.runlog import PROVENANCE_FILE


def read_provenance(run_dir: Path) -> dict[str, Any] | None:
    """The run's `provenance.json` (weights and code hashes, torch version, machine), or None for a run without one."""
    path = run_path(run_dir, PROVENANCE_FILE)  # a symlink there is refused, not read as this run's record
    return json.loads(read_utf8(path)) if path.exists() else None


def check_same_weights(runs: dict[str, list[dict]]) -> dict[str, Any]:
    """Refuse runs that start from different weights, naming them; say how many runs recorded none.

    Returns {"weights_sha256": the shared hash or None, "num_unrecorded": runs without provenance, "machines": the
    distinct (torch, cpu, gpu) the runs recorded, "code": {tracerl source hash: runs that ran it, at the start or
    after a resume}}. Runs of different code are paired, and the report says so."""
    by_hash: dict[str, list[str]] = {}
    code: dict[str, int] = {}
    unrecorded, machines = 0, set()
    for seed_runs in runs.values():
        for run in seed_runs:
            record = run.get("provenance")
            if not record:
                unrecorded += 1
                continue
            by_hash.setdefault(record["weights_sha256"], []).append(run["name"])
            machines.add((record.get("torch"), record.get("cpu"), record.get("gpu")))
            for sha in {record.get("code_sha256"), *record.get("code_sha256_resumed", [])} - {None}:
                code[sha] = code.get(sha, 0) + 1  # a run resumed under other code counts under each
    if len(by_hash) > 1:
        groups = "; ".join(f"{h[:16]}: {', '.join(sorted(names))}" for h, names in sorted(by_hash.items()))
        raise ValueError(f"the runs start from {len(by_hash)} different weights ({groups}); a comparison pairs runs "
                         "of one starting policy: train every entry and seed from the same build")
    return {"weights_sha256": next(iter(by_hash), None), "num_unrecorded": unrecorded,
            "machines": [list(m) for m in sorted(machines, key=str)], "code": dict(sorted(code.items()))}


def provenance_sentence(weights: dict[str, Any]) -> str:
    """The report's line on what the runs started from (`check_same_weights`' result): the shared weights hash, the
    machines, and the code hashes (runs from before code was recorded add none)."""
    recorded = "every run" if not weights["num_unrecorded"] else \
        f"{weights['num_unrecorded']} run(s) recorded none (unchecked); the others"
    code = weights.get("code", {})
    said = "; ".join(f"{h[:16]} in {n} run(s)" for h, n in code.items())
    return ("Starting weights: " + (f"{recorded} started from sha256 {weights['weights_sha256'][:16]}"
                                    if weights["weights_sha256"] else "not recorded by any run (unchecked)")
            + "".join(f"; torch {t}, {c}" + (f", {g}" if g else "") for t, c, g in weights["machines"]) + "."
            + ("" if not code else f" Code: tracerl source sha256 {said}." if len(code) == 1 else
               f" Code: {len(code)} different tracerl sources ({said}): the pairs compare code as well as methods."))
