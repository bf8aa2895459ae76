#!/usr/bin/env bash
# Continue a pre-registered testbed's runs on this machine from the records kept in this repository
# (benchmarks/preregistration.md, amendment 9): put the kept runs and build back into FROZEN (a checkout of the tree the
# runs train from), then train the seeds not yet kept, LANES processes at a time, each lane one seed at a time in
# FROZEN's benchmarks/preregistered.sh, keeping every seed in benchmarks/results/preregistered-<testbed>/runs/ as soon
# as its three runs finish (and the build the runs started from, with the first). Each lane logs to
# FROZEN/runs/preregistered/<testbed>/lane-<n>.log.
#
#   benchmarks/continue_preregistered.sh default|headroom FROZEN [LANES] [--dry-run]
#
# Seeds go to lanes round-robin, so no two processes ever train one run; a lock on FROZEN's runs folder refuses a
# second invocation while one runs. --dry-run restores nothing and trains nothing: it prints each lane's seeds. The
# build goes to $TRACERL_CACHE (default ~/.cache/tracerl), where FROZEN's runs look for it. This script's Python
# (run_records.py) is the active environment's with this tree's package; FROZEN's runs use FROZEN/src.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
args=()
dry=false
for arg in "$@"; do if [ "$arg" = --dry-run ]; then dry=true; else args+=("$arg"); fi; done
testbed=${args[0]:?"name a testbed: default or headroom"}
frozen=$(cd "${args[1]:?"name the frozen tree (a checkout of the commit the runs train from)"}" && pwd)
lanes=${args[2]:-2}
case "$testbed" in
  default) seeds=0-29 ;;  # the seed counts of preregistration.md
  headroom) seeds=0-40 ;;
  *) echo "unknown testbed $testbed: use default or headroom" >&2; exit 2 ;;
esac
case "$lanes" in ''|*[!0-9]*|0) echo "LANES must be a positive number, not '$lanes'" >&2; exit 2 ;; esac
if [ -e "$here/benchmarks/results/preregistered-$testbed/primary.md" ]; then
  echo "$testbed has been read (benchmarks/results/preregistered-$testbed/primary.md): its runs are not trained again" >&2
  exit 1
fi
records=$here/benchmarks/results/preregistered-$testbed/runs
runs=$frozen/runs/preregistered/$testbed
cache=${TRACERL_CACHE:-$HOME/.cache/tracerl}
keep() { env -u PYTHONPATH python "$here/benchmarks/run_records.py" "$@"; }

if [ ! -x "$frozen/benchmarks/preregistered.sh" ]; then
  echo "$frozen has no benchmarks/preregistered.sh: give a checkout of the tree the runs train from" >&2
  exit 2
fi
read -r -a pending <<< "$(keep pending "$records" --seeds "$seeds" | tr ',' ' ')"
expanded=()
for part in "${pending[@]}"; do
  if [[ $part == *-* ]]; then expanded+=($(seq "${part%-*}" "${part#*-}")); else expanded+=("$part"); fi
done
if [ ${#expanded[@]} = 0 ]; then
  echo "continue_preregistered: every planned seed of $testbed is kept in $records; read it with read_preregistered.sh"
  exit 0
fi
plan=()
for ((lane = 0; lane < lanes; lane++)); do
  mine=()
  for ((i = lane; i < ${#expanded[@]}; i += lanes)); do mine+=("${expanded[i]}"); done
  plan+=("${mine[*]}")
  echo "continue_preregistered: lane $lane trains seeds ${mine[*]:-none} (progress: $runs/lane-$lane.log)"
done
$dry && exit 0

mkdir -p "$runs" "$cache"
exec 9> "$runs/.continue.lock"
flock -n 9 || { echo "another continue_preregistered.sh is training $runs; not starting a second" >&2; exit 1; }
keep restore "$records" "$runs" --cache "$cache"
for ((lane = 0; lane < lanes; lane++)); do
  (
    for seed in ${plan[lane]}; do
      (cd "$frozen" && PYTHONPATH="$frozen/src" TRACERL_CACHE="$cache" benchmarks/preregistered.sh "$testbed" \
        "$seed-$seed") >> "$runs/lane-$lane.log" 2>&1
      keep save "$runs" "$records"
    done
  ) &
done
wait
echo "continue_preregistered: lanes done; kept seeds: $(ls "$records" | grep -c -- '-seed') runs in $records"
