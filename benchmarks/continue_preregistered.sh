#!/usr/bin/env bash
# Continue a pre-registered design's runs on this machine from the records kept in this repository
# (benchmarks/preregistration.md, amendment 9): put the kept runs and build back into FROZEN (a checkout of the commit
# the design's runs train from, refused if its HEAD is another), then train the seeds not yet kept, LANES processes
# at a time, each lane one seed at a time with FROZEN's own script, keeping every seed in
# benchmarks/results/<results>/runs/ as soon as its three runs finish (and the build they started from, with the
# first). Each lane logs to FROZEN/<runs>/lane-<n>.log.
#
#   benchmarks/continue_preregistered.sh DESIGN FROZEN [LANES] [--dry-run]
#
#   design      seeds    FROZEN at  trains with (FROZEN's)                                  kept in results/
#   default     0-29     caeaa86    preregistered.sh default                                preregistered-default
#   headroom    0-40     caeaa86    preregistered.sh headroom                               preregistered-headroom
#   funcall     0-88     9e8af0d    domains_equal_tokens.sh funcall (256 questions)         domain-funcall-confirmatory
#   math-pilot  100-105  f46d1cc    domains_equal_tokens.sh math                            domain-math-equal-tokens
#
# (the multihop testbeds' FROZEN also carries amendment 1's engine change, uncommitted: see
# results/preregistered-headroom/README.md). A pending seed is trained from step 0, never resumed: run folders of it
# left by a stopped lane are moved to FROZEN/<runs>/.stopped/ first. Seeds go to lanes round-robin, so no two
# processes ever train one run; a lock on FROZEN's runs folder refuses a second invocation while one runs; a design
# already read (primary.md in its results folder) is refused. A seed that fails to train (or to be kept) is reported
# and stays pending while its lane goes on; the script then exits 1, naming the seeds still pending. --dry-run restores nothing and trains nothing: it
# prints each lane's seeds. The build goes to $TRACERL_CACHE (default ~/.cache/tracerl), where FROZEN's runs look
# for it. This script's Python (run_records.py) is the active environment's with this tree's package; FROZEN's runs
# use FROZEN/src.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
args=()
dry=false
for arg in "$@"; do if [ "$arg" = --dry-run ]; then dry=true; else args+=("$arg"); fi; done
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
if [ -e "$here/benchmarks/results/$results/primary.md" ]; then
  echo "$design has been read (benchmarks/results/$results/primary.md): its runs are not trained again" >&2
  exit 1
fi
head=$(git -C "$frozen" rev-parse HEAD 2>/dev/null || true)
if [[ $head != $commit* ]]; then
  echo "$frozen is at '${head:0:7}', not $commit, the commit $design's runs train from:" \
    "git worktree add DIR $commit" >&2
  exit 2
fi
records=$here/benchmarks/results/$results/runs
runs=$frozen/$out
cache=${TRACERL_CACHE:-$HOME/.cache/tracerl}
keep() { env -u PYTHONPATH python "$here/benchmarks/run_records.py" "$@"; }

read -r -a pending <<< "$(keep pending "$records" --seeds "$seeds" | tr ',' ' ')"
expanded=()
for part in "${pending[@]}"; do
  if [[ $part == *-* ]]; then expanded+=($(seq "${part%-*}" "${part#*-}")); else expanded+=("$part"); fi
done
if [ ${#expanded[@]} = 0 ]; then
  echo "continue_preregistered: every planned seed of $design is kept in $records"
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
lane_pids=()
for ((lane = 0; lane < lanes; lane++)); do
  (  # a seed that fails to train or to keep is reported and left pending; the lane goes on to its next seed
    failed=0
    for seed in ${plan[lane]}; do
      # a pending seed's run folders here were stopped part-way: set aside, so the seed trains from step 0
      for dir in "$runs"/*-seed"$seed"; do
        [ -d "$dir" ] && mkdir -p "$runs/.stopped" && mv "$dir" "$runs/.stopped/${dir##*/}.$(date +%Y%m%d%H%M%S)"
      done
      if ! (cd "$frozen" && PYTHONPATH="$frozen/src" TRACERL_CACHE="$cache" "${train[@]}" "$seed-$seed" "${extra[@]}") \
        >> "$runs/lane-$lane.log" 2>&1; then
        echo "continue_preregistered: seed $seed failed to train (lane-$lane.log); it stays pending" >&2
        failed=1
      fi
      keep save "$runs" "$records" || { echo "continue_preregistered: keeping after seed $seed failed" >&2; failed=1; }
    done
    exit $failed
  ) &
  lane_pids+=($!)
done
status=0
for pid in "${lane_pids[@]}"; do wait "$pid" || status=1; done
left=$(keep pending "$records" --seeds "$seeds")
echo "continue_preregistered: lanes done; $(ls "$records" | grep -c -- '-seed') runs kept in $records; seeds" \
  "still pending: ${left:-none}"
exit $status
