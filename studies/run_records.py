"""Keep a comparison's finished runs as small records a report can be rewritten from, and put them back.

    python studies/run_records.py save RUNS_DIR RECORDS [--methods grpo,pcl,trace] [--policy BUILD_DIR | --no-build]
    python studies/run_records.py restore RECORDS RUNS_DIR [--cache CACHE_DIR]
    python studies/run_records.py pending RECORDS --seeds 0-40 [--methods grpo,pcl,trace]
    python studies/run_records.py cost RECORDS --seeds 0-40 [--lanes 2]
    python studies/run_records.py pack RECORDS_DIR ARCHIVE

A long comparison (`studies/preregistered.sh`: 41 seeds x 3 methods) outlives the machine it starts on. `save`
copies, for every seed whose runs of all `--methods` are finished (their last step trained and evaluated, at the
stop their config set: `run.num_steps` or `run.total_token_budget`), what `tracerl compare --report-only` reads of
each run: `metrics.jsonl`, `config.json`, `provenance.json` (starting weights, torch, machine), the first step's
trees (the regime of the first batches) and, where the trainer wrote them, every step's rollout records
(`rollouts/`, a few kB a step: what the stage-2 and grant tables read, `tracerl.core.tally`); not the checkpoints or
later trees. A seed is kept whole or not at all, so
its three runs trained on one machine; `saved_on.json` beside each run names the machine that saved it (CPU model
and a hash of its flags). With the first seed it also keeps the build the runs started from (`--policy`, else the
local build their `provenance.json` names; the embedded policy's cache folder, about 2 MB), so a later machine
starts from the same weights instead of rebuilding (a build is bit-identical across thread counts on one machine,
not across machines); a seed whose runs start from other weights than those kept is refused. `--no-build` keeps none:
for a design whose unit is the build, one records per build, each build made again from its seed and checked
against the weights hash every run's `provenance.json` holds. Records already kept
are never overwritten. Saves and restores of one records folder take turns (a lock on the folder), so lanes that
finish seeds at the same moment each keep theirs once, and a lane starting beside others restores whole runs.

RECORDS is a folder or an archive, `runs.tar.xz` (this repository keeps each design's records as
`studies/<table>/runs.tar.xz`): an archive is unpacked into a temporary folder for each command and, after a
`save` that kept something, packed again and renamed into place (the lock is then on the archive's folder). `pack`
makes an archive from a records folder. Packing is deterministic, so the same records give the same bytes: members
in name order under `runs/`, mtime 0, uid and gid 0, no owner names, mode 644, no folder members; xz at preset 9.
A run's trees are stored as their JSON (`trees/step-000001.json`, which xz compresses to half of what the gzip file
does, across runs) and gzipped again when unpacked, so a run put back reads as it did (`tracerl.io.files.runlog`).

`restore` copies the records back into a runs folder (a run folder already there must hold the same metrics) and
the kept build into `--cache` (`$TRACERL_CACHE`); `pending` prints the seeds of `--seeds` not yet kept, as a list
`tracerl compare --seeds` reads; `cost` the minutes each kept seed's runs logged and what the pending seeds will
take at their median, in whole rounds of `--lanes` (it prints no success figure, so a design not yet read can be
planned by it). Train only pending seeds: a restored run has no checkpoint, and `tracerl compare` on its seed would
train it again from step 0.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import gzip
import hashlib
import io
import json
import lzma
import os
import platform
import re
import shutil
import statistics
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tracerl.io.files.runlog import finished_run, read_metrics
from tracerl.report.compare import seed_spans

KEPT = ("metrics.jsonl", "config.json", "provenance.json", "trees/step-000001.json.gz")
ROLLOUTS = "rollouts/step-*.json"  # every step's rollouts in columns, where the run's trainer wrote them
RUN_NAME = re.compile(r"^(?P<label>.+)-seed(?P<seed>\d+)$")
POLICY = "policy"
ARCHIVE = ".tar.xz"
MTIME = 0  # every member's modification time in an archive: the same records pack to the same bytes


def parse_seeds(text: str) -> list[int]:
    """'0-40', '3,5,9-11' -> the seeds (a bare number is a seed here, not a count)."""
    seeds: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, _, hi = part.partition("-")
        seeds.extend(range(int(lo), int(hi or lo) + 1))
    return sorted(set(seeds))


def format_seeds(seeds: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5', and one seed k as 'k-k': what `tracerl compare --seeds` reads back as these seeds
    (a bare 'k' is a count there)."""
    return f"{seeds[0]}-{seeds[0]}" if len(set(seeds)) == 1 else ",".join(seed_spans(seeds))


def finished(run_dir: Path) -> bool:
    """Whether a run reached the stop its saved config set and evaluated its last step (`finished_run`; a run
    without a saved config is not kept)."""
    return finished_run(run_dir) is True


def machine() -> dict[str, str]:
    """The CPU model and a hash of its feature flags: what decides whether float results can match bit for bit."""
    model, flags = platform.machine(), ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == platform.machine():
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = " ".join(sorted(value.split()))
    except OSError:
        pass
    return {"cpu": model, "cpu_flags_sha256": hashlib.sha256(flags.encode()).hexdigest()[:16],
            "python": platform.python_version()}


def seeds_in(folder: Path, labels: list[str]) -> dict[int, dict[str, Path]]:
    """seed -> {label: run folder} for the run folders of `labels` in `folder`."""
    found: dict[int, dict[str, Path]] = {}
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        match = RUN_NAME.match(path.name)
        if path.is_dir() and match and match["label"] in labels:
            found.setdefault(int(match["seed"]), {})[match["label"]] = path
    return found


def whole_seeds(folder: Path, labels: list[str]) -> dict[int, dict[str, Path]]:
    """The seeds of `seeds_in` with a run folder for every label."""
    return {seed: dirs for seed, dirs in seeds_in(folder, labels).items() if set(dirs) == set(labels)}


def starting_weights(run_dir: Path) -> tuple[str | None, Path | None]:
    """(weights hash, build folder) from a run's provenance.json: the folder only when it is a local build."""
    try:
        record = json.loads((run_dir / "provenance.json").read_text())
    except (OSError, ValueError):
        return None, None
    source = Path(record.get("source") or "")
    return record.get("weights_sha256"), source if record.get("source") and (source / "model").is_dir() else None


def is_archive(records: Path) -> bool:
    return records.name.endswith(ARCHIVE)


def pack(folder: Path, archive: Path) -> None:
    """Write every file of the records folder `folder` into `archive`, deterministically (the module docstring); a
    top-level entry starting with '.' (a run `save` was copying when it stopped) is left out, a link refused."""
    stem = archive.name[: -len(ARCHIVE)]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for path in sorted(folder.rglob("*"), key=lambda p: p.relative_to(folder).as_posix()):
            name = path.relative_to(folder).as_posix()
            if name.startswith(".") or path.is_dir() and not path.is_symlink():
                continue
            if path.is_symlink() or not path.is_file():
                raise ValueError(f"{path} is not a plain file; records hold plain files only")
            data = path.read_bytes()
            if path.parent.name == "trees" and name.endswith(".json.gz"):
                data, name = gzip.decompress(data), name[: -len(".gz")]
            info = tarfile.TarInfo(f"{stem}/{name}")
            info.size, info.mtime, info.mode = len(data), MTIME, 0o644
            tar.addfile(info, io.BytesIO(data))
    tmp = archive.with_name(f".{archive.name}.tmp")
    tmp.write_bytes(lzma.compress(buffer.getvalue(), preset=9))
    os.replace(tmp, archive)


def unpack(archive: Path, folder: Path) -> None:
    """Put the files of `archive` (made by `pack`) into `folder`, the trees gzipped again."""
    stem = archive.name[: -len(ARCHIVE)] + "/"
    with tarfile.open(archive, "r:xz") as tar:
        for member in tar:
            relative = Path(member.name[len(stem):])
            if (not member.isfile() or not member.name.startswith(stem) or relative.is_absolute()
                    or ".." in relative.parts):
                raise ValueError(f"{archive}: member {member.name!r} is not a records file under {stem}")
            data = tar.extractfile(member).read()
            if relative.parent.name == "trees" and relative.suffix == ".json":
                data, relative = gzip.compress(data, mtime=0), relative.with_name(relative.name + ".gz")
            (folder / relative).parent.mkdir(parents=True, exist_ok=True)
            (folder / relative).write_bytes(data)


@contextlib.contextmanager
def records_folder(records: Path, write: bool = False) -> Iterator[Path]:
    """`records` itself when it is a folder; for an archive, its files unpacked into a temporary folder, packed back
    at the end (also after an error, so what was kept before it stays kept) when `write` and a file was added."""
    if not is_archive(records):
        yield records
        return
    with tempfile.TemporaryDirectory(prefix="run-records-") as tmp:
        folder = Path(tmp) / "runs"
        folder.mkdir()
        if records.exists():
            unpack(records, folder)
        before = _files(folder)
        try:
            yield folder
        finally:
            if write and _files(folder) != before:
                pack(folder, records)


def _files(folder: Path) -> list[str]:
    """The files `pack` would write, by name."""
    return sorted(name for p in folder.rglob("*") if not (name := p.relative_to(folder).as_posix()).startswith("."))


def save(runs: Path, records: Path, labels: list[str], policy: Path | None = None, keep_build: bool = True,
         ) -> list[int]:
    """Keep every finished seed of `runs` not yet in `records`, and (with `keep_build`) the build its runs started
    from when none is kept yet (`policy`, else the local build their provenance names); return the seeds kept now. A
    seed whose runs start from other weights than the runs already kept is refused, naming both."""
    (records.parent if is_archive(records) else records).mkdir(parents=True, exist_ok=True)
    with _turn(records), records_folder(records, write=True) as folder:
        return _save(runs, folder, labels, policy, keep_build)


@contextlib.contextmanager
def _turn(records: Path) -> Iterator[None]:
    """Hold the records folder's lock (an archive's: its folder's): saves and restores into or from one records take
    turns, whichever process (or lane) runs them; the kernel drops the lock if its process dies."""
    folder = os.open(records.parent if is_archive(records) else records, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        yield
    finally:
        os.close(folder)


def _save(runs: Path, records: Path, labels: list[str], policy: Path | None, keep_build: bool) -> list[int]:
    saved = []
    kept_weights = {starting_weights(d)[0] for d in records.iterdir() if RUN_NAME.match(d.name)} - {None}
    for seed, dirs in sorted(whole_seeds(runs, labels).items()):
        if not all(finished(d) for d in dirs.values()):
            continue
        present = [(records / d.name).exists() for d in dirs.values()]
        if all(present):
            continue
        if any(present):
            raise FileExistsError(f"the records hold part of seed {seed}'s runs; remove them or restore them first")
        weights = {starting_weights(d)[0] for d in dirs.values()} - {None}
        if len(weights | kept_weights) > 1:
            raise ValueError(f"seed {seed}'s runs start from weights {sorted(w[:12] for w in weights)}, the kept runs "
                             f"from {sorted(w[:12] for w in kept_weights)}: train it from the kept build "
                             f"(the records' {POLICY}/, restored into $TRACERL_CACHE) before keeping it")
        kept_weights |= weights
        policy = policy or next(filter(None, (starting_weights(d)[1] for d in dirs.values())), None)
        for run_dir in dirs.values():
            target = records / run_dir.name
            tmp = records / f".{run_dir.name}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            for name in [*KEPT, *(p.relative_to(run_dir).as_posix() for p in sorted(run_dir.glob(ROLLOUTS)))]:
                if (run_dir / name).exists():
                    (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(run_dir / name, tmp / name)
            (tmp / "saved_on.json").write_text(json.dumps(machine(), indent=1) + "\n")
            tmp.rename(target)
        saved.append(seed)
    if keep_build and policy is not None and not any((records / POLICY).glob("*/model")):
        shutil.copytree(policy, records / POLICY / policy.name)
    return saved


def restore(records: Path, runs: Path, cache: Path | None = None) -> list[str]:
    """Copy kept runs back into `runs` (and the kept build into `cache`); return the run names restored."""
    with _turn(records), records_folder(records) as folder:
        return _restore(folder, runs, cache)


def _restore(records: Path, runs: Path, cache: Path | None) -> list[str]:
    restored = []
    for kept in sorted(p for p in records.iterdir() if p.is_dir() and RUN_NAME.match(p.name)):
        target = runs / kept.name
        if target.exists():
            if (target / "metrics.jsonl").read_bytes() != (kept / "metrics.jsonl").read_bytes():
                raise FileExistsError(f"{target} holds other metrics than the kept {kept.name}; move it away before "
                                      "restoring")
            continue
        shutil.copytree(kept, target)
        restored.append(kept.name)
    if cache is not None and (records / POLICY).is_dir():
        for build in (records / POLICY).iterdir():
            if not (cache / build.name).exists():
                shutil.copytree(build, cache / build.name)
    return restored


def pending(records: Path, seeds: list[int], labels: list[str]) -> list[int]:
    with records_folder(records) as folder:
        kept = whole_seeds(folder, labels)
    return [s for s in seeds if s not in kept]


def seed_minutes(records: Path, labels: list[str]) -> list[float]:
    """Minutes each kept seed's runs logged (their steps' `sys/step_seconds` and evaluations' `eval/seconds`), in
    seed order: what a seed costs a lane, less each process's start and load. An evaluation row that several runs
    of the seed log identically, seconds included, was computed once and shared (`tracerl compare` shares the
    step-0 evaluation among a seed's methods), so it counts once. Prints no success figure."""
    minutes = []
    with records_folder(records) as folder:
        for dirs in whole_seeds(folder, labels).values():
            seconds, evals = 0.0, set()
            for run_dir in dirs.values():
                for row in read_metrics(run_dir):
                    if row.get("kind") == "train":
                        seconds += row.get("sys/step_seconds", 0.0)
                    elif (key := json.dumps(row, sort_keys=True)) not in evals:
                        evals.add(key)
                        seconds += row.get("eval/seconds", 0.0)
            minutes.append(seconds / 60)
    return minutes


def describe_cost(records: Path, seeds: list[int], labels: list[str], lanes: int) -> str:
    with records_folder(records) as folder:  # an archive unpacked once for both
        minutes = sorted(seed_minutes(folder, labels))
        left = len(pending(folder, seeds, labels))
    if not minutes:
        return f"{left} seeds pending; no seed kept yet to time them by"
    median = statistics.median(minutes)
    rounds = -(-left // lanes)  # lanes train whole seeds: an odd seed left over takes a round of its own
    return (f"{len(minutes)} seeds kept took {minutes[0]:.0f}-{minutes[-1]:.0f} minutes each by their runs' logged "
            f"seconds (median {median:.0f}); the {left} pending, {rounds} round(s) of {lanes} lane(s), about "
            f"{rounds * median / 60:.1f} hours")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_save = sub.add_parser("save", help="keep the finished seeds of a runs folder")
    p_save.add_argument("runs", type=Path)
    p_save.add_argument("records", type=Path)
    p_save.add_argument("--policy", type=Path, help="the build folder the runs started from, kept once")
    p_save.add_argument("--no-build", action="store_true", help="keep no build (a design whose unit is the build)")
    p_restore = sub.add_parser("restore", help="put kept runs (and the kept build) back")
    p_restore.add_argument("records", type=Path)
    p_restore.add_argument("runs", type=Path)
    p_restore.add_argument("--cache", type=Path, help="the TRACERL_CACHE folder to put the kept build in")
    p_pending = sub.add_parser("pending", help="the seeds not yet kept")
    p_pending.add_argument("records", type=Path)
    p_pending.add_argument("--seeds", required=True, help="e.g. 0-40")
    p_cost = sub.add_parser("cost", help="minutes a kept seed took, and what the pending seeds will take")
    p_cost.add_argument("records", type=Path)
    p_cost.add_argument("--seeds", required=True, help="the planned seeds, e.g. 0-40")
    p_cost.add_argument("--lanes", type=int, default=1, help="seeds trained at once")
    for p in (p_save, p_pending, p_cost):
        p.add_argument("--methods", default="grpo,pcl,trace")
    p_pack = sub.add_parser("pack", help="a records folder as its archive (deterministic: same records, same bytes)")
    p_pack.add_argument("folder", type=Path)
    p_pack.add_argument("archive", type=Path, help="e.g. studies/<table>/runs.tar.xz")
    args = parser.parse_args(argv)
    if args.command == "save":
        if not args.runs.is_dir():
            parser.error(f"{args.runs} is not a folder of runs")
        if args.policy is not None and not (args.policy / "model").is_dir():
            parser.error(f"{args.policy} is not a build folder (no model/ in it): give $TRACERL_CACHE/<build id>")
        seeds = save(args.runs, args.records, args.methods.split(","), args.policy, keep_build=not args.no_build)
        print(f"run_records: kept seeds {format_seeds(seeds) or 'none'} in {args.records}")
    elif args.command == "restore":
        if not (args.records.is_file() if is_archive(args.records) else args.records.is_dir()):
            parser.error(f"{args.records} holds no records")
        args.runs.mkdir(parents=True, exist_ok=True)
        names = restore(args.records, args.runs, args.cache)
        print(f"run_records: restored {len(names)} runs into {args.runs}")
    elif args.command == "pack":
        if not args.folder.is_dir() or not is_archive(args.archive):
            parser.error(f"pack FOLDER ARCHIVE: a records folder and an archive named *{ARCHIVE}")
        pack(args.folder, args.archive)
        print(f"run_records: packed {args.folder} into {args.archive} ({args.archive.stat().st_size:,} bytes)")
    elif args.command == "pending":
        seeds = pending(args.records, parse_seeds(args.seeds), args.methods.split(","))
        print(format_seeds(seeds))
    else:
        print(describe_cost(args.records, parse_seeds(args.seeds), args.methods.split(","), max(args.lanes, 1)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
