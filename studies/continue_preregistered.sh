#!/usr/bin/env bash
# Continue a pre-registered design's runs on this machine from the records kept in this repository
# (studies/preregistration.md, amendments 9 and 10): put the kept runs and build back into FROZEN (a checkout of
# the commit the design's runs train from, refused if its HEAD is another), then train the seeds not yet kept, LANES
# processes at a time, each lane one seed at a time with FROZEN's own script (at those commits it lives in FROZEN's
# benchmarks/), keeping every seed in studies/<table>/runs.tar.xz as soon as its three runs finish (and the build
# they started from, with the first). Each seed logs to FROZEN/<runs>/logs/seed-<n>.log.
#
#   studies/continue_preregistered.sh DESIGN FROZEN [LANES] [--until TIME] [--dry-run]
#
#   design      seeds    FROZEN at  trains with (FROZEN's)                                  kept in studies/
#   default     0-29     caeaa86    benchmarks/preregistered.sh default                     preregistered-default
#   headroom    0-40     caeaa86    benchmarks/preregistered.sh headroom                    preregistered-headroom
#   funcall     0-88     9e8af0d    benchmarks/domains_equal_tokens.sh funcall (256 q.)     domain-funcall-confirmatory
#   math-pilot  100-105  f46d1cc    benchmarks/domains_equal_tokens.sh math                 domain-math-equal-tokens
#
# (the multihop testbeds' FROZEN also carries amendment 1's engine change, uncommitted: see
# studies/preregistered-headroom/README.md). A lane takes the pending seeds in order, each the first that no lane
# holds: a seed is held by a lock file (FROZEN/<runs>/.seed-<n>.lock) while it trains, so no two processes ever train
# one run, whether they are lanes of one invocation or of several (several may run at once, e.g. one lane of each of
# two designs, or a second invocation started when a core frees up); the kernel drops the lock when its lane's
# processes end. A pending seed is trained from step 0, never resumed: run folders of it left by a stopped lane are
# moved to FROZEN/<runs>/.stopped/ first. --until TIME (anything `date -d` reads, e.g. 04:10) stops each lane from
# starting a seed at or after TIME; the seeds it did not start stay pending, and the exit status is 0. A design
# already read (primary.md in its studies/ folder) is refused. A seed that fails to train (or to be kept) is reported
# and stays pending while its lane goes on; the script then exits 1, naming the seeds still pending. --dry-run
# restores nothing and trains nothing: it prints the pending seeds, those a lane is training now, and the hours the
# pending seeds will take at the kept seeds' median (run_records.py cost). The build goes to $TRACERL_CACHE (default
# ~/.cache/tracerl), where FROZEN's runs look for it. This script's Python (run_records.py) is the active
# environment's with this tree's package; FROZEN's runs use FROZEN/src.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
args=()
dry=false
until_text=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=true ;;
    --until) until_text=${2:?"--until needs a time, e.g. --until 04:10"}; shift ;;
    *) args+=("$1") ;;
  esac
  shift
done
design=${args[0]:?"name a design: default, headroom, funcall or math-pilot"}
frozen=$(cd "${args[1]:?"name the frozen tree (a checkout of the commit the runs train from)"}" && pwd)
lanes=${args[2]:-2}
case "$design" in  # the seed counts and trees of preregistration.md (amendments 2, 7, 8)
  default|headroom) seeds=$([ "$design" = default ] && echo 0-29 || echo 0-40); commit=caeaa86
    out=runs/preregistered/$design; results=preregistered-$design
    train=(benchmarks/preregistered.sh "$design"); extra=() ;;
  funcall) seeds=0-88; commit=9e8af0d; out=runs/domains-equal-tokens/funcall; results=domain-funcall-confirmatory
    train=(benchmarks/domains_equal_tokens.sh funcall); extra=(--jobs 1 --set run.eval_prompts=256) ;;
  math-pilot) seeds=100-105; commit=f46d1cc; out=runs/domains-equal-tokens/math; results=domain-math-equal-tokens
    train=(benchmarks/domains_equal_tokens.sh math); extra=() ;;
  *) echo "unknown design $design: use default, headroom, funcall or math-pilot" >&2; exit 2 ;;
esac
case "$lanes" in ''|*[!0-9]*|0) echo "LANES must be a positive number, not '$lanes'" >&2; exit 2 ;; esac
deadline=""
if [ -n "$until_text" ]; then
  deadline=$(date -d "$until_text" +%s 2>/dev/null) ||
    { echo "--until '$until_text' is not a time date -d reads: give e.g. 04:10 or '2026-11-27 04:10'" >&2; exit 2; }
  until_text=$(date -d "@$deadline" '+%Y-%m-%d %H:%M')
fi
if [ -e "$here/studies/$results/primary.md" ]; then
  echo "$design has been read (studies/$results/primary.md): its runs are not trained again" >&2
  exit 1
fi
head=$(git -C "$frozen" rev-parse HEAD 2>/dev/null || true)
if [[ $head != $commit* ]]; then
  echo "$frozen is at '${head:0:7}', not $commit, the commit $design's runs train from:" \
    "git worktree add DIR $commit" >&2
  exit 2
fi
records=$here/studies/$results/runs.tar.xz
runs=$frozen/$out
cache=${TRACERL_CACHE:-$HOME/.cache/tracerl}
keep() { env -u PYTHONPATH python "$here/studies/run_records.py" "$@"; }

read -r -a pending <<< "$(keep pending "$records" --seeds "$seeds" | tr ',' ' ')"
expanded=()
for part in "${pending[@]}"; do
  if [[ $part == *-* ]]; then expanded+=($(seq "${part%-*}" "${part#*-}")); else expanded+=("$part"); fi
done
if [ ${#expanded[@]} = 0 ]; then
  echo "continue_preregistered: every planned seed of $design is kept in $records"
  exit 0
fi
echo "continue_preregistered: $lanes lane(s) train the pending seeds of $design in order, each the first no lane" \
  "holds: ${expanded[*]}${deadline:+ (no seed started at or after $until_text)} (logs: $runs/logs/)"
if $dry; then  # which pending seeds a lane (of any invocation) holds now
  held=()
  for seed in "${expanded[@]}"; do
    [ -e "$runs/.seed-$seed.lock" ] && ! flock -n "$runs/.seed-$seed.lock" true && held+=("$seed")
  done
  echo "continue_preregistered: training now: ${held[*]:-none}"
  echo "continue_preregistered: $(keep cost "$records" --seeds "$seeds" --lanes "$lanes")"
  exit 0
fi

mkdir -p "$runs/logs" "$cache"
[ -e "$records" ] && keep restore "$records" "$runs" --cache "$cache"

train_lane() {  # LANE: the pending seeds no lane holds, one at a time; 1 when one failed to train or to be kept
  local failed=0 seed lock
  for seed in "${expanded[@]}"; do
    if [ -n "$deadline" ] && [ "$(date +%s)" -ge "$deadline" ]; then
      echo "continue_preregistered: lane $1 reached $until_text; it starts no more seeds"
      break
    fi
    exec {lock}> "$runs/.seed-$seed.lock"
    if ! flock -n "$lock" || [ -z "$(keep pending "$records" --seeds "$seed-$seed")" ]; then
      exec {lock}>&-  # another lane trains it, or has kept it since this lane started
      continue
    fi
    # a pending seed's run folders here were stopped part-way: set aside, so the seed trains from step 0
    for dir in "$runs"/*-seed"$seed"; do
      [ -d "$dir" ] && mkdir -p "$runs/.stopped" && mv "$dir" "$runs/.stopped/${dir##*/}.$(date +%Y%m%d%H%M%S)"
    done
    echo "continue_preregistered: lane $1 trains seed $seed (log: $runs/logs/seed-$seed.log)"
    if ! (cd "$frozen" && PYTHONPATH="$frozen/src" TRACERL_CACHE="$cache" "${train[@]}" "$seed-$seed" "${extra[@]}") \
      >> "$runs/logs/seed-$seed.log" 2>&1; then
      echo "continue_preregistered: seed $seed failed to train (logs/seed-$seed.log); it stays pending" >&2
      failed=1
    fi
    keep save "$runs" "$records" || { echo "continue_preregistered: keeping after seed $seed failed" >&2; failed=1; }
    exec {lock}>&-
  done
  return $failed
}

lane_pids=()
for ((lane = 0; lane < lanes; lane++)); do
  train_lane "$lane" &
  lane_pids+=($!)
done
status=0
for pid in "${lane_pids[@]}"; do wait "$pid" || status=1; done
left=$(keep pending "$records" --seeds "$seeds")
echo "continue_preregistered: lanes done; the kept seeds are in $records; seeds still pending: ${left:-none}"
exit $status
