#!/usr/bin/env bash
# The reading of a pre-registered testbed once every planned run is complete (studies/preregistration.md,
# amendment 5), in one go and in the planned order:
#
#   1. the frozen tree's reports over the runs: FROZEN is the checkout the runs were trained with; its own
#      benchmarks/preregistered.sh --report-only (at the frozen commit the studies lived in benchmarks/) writes them
#      under FROZEN/benchmarks/results/preregistered-<testbed>/;
#   2. this tree's reports and verdict over the same runs (studies/preregistered.sh --report-only here, which
#      ends with `tracerl verdict` -> primary.md); runs/preregistered/<testbed> here must be those runs (a link to
#      FROZEN/runs/preregistered/<testbed> is made when it is missing);
#   3. studies/same_report.py on each pair of reports (against grpo, against pcl): this tree's must hold every
#      field of the frozen tree's, or the script stops before anyone reads primary.md;
#   4. studies/preregistered_facts.py: the figures a study's README quotes, in facts.md beside the reports; and,
#      exploratory, stage 2 on its own terms over the `trace` runs' trees (stage2.md, stage2-calibration.md): the
#      runs that still have every step's trees (one restored from kept records has the first step's only), named.
#
#   studies/read_preregistered.sh default|headroom FROZEN
#
# It refuses to read a testbed whose planned runs are not all complete (30 seeds for default, 41 for headroom):
# the plan reads each testbed only at its planned count.
set -euo pipefail
cd "$(dirname "$0")/.."
testbed=${1:?"name a testbed: default or headroom"}
frozen=$(cd "${2:?"name the frozen tree (the checkout the runs were trained with)"}" && pwd)
case "$testbed" in
  default) config=configs/trace.toml; seeds=30; planned=30 ;;
  headroom) config=configs/trace-headroom.toml; seeds=0-40; planned=41 ;;
  *) echo "unknown testbed $testbed: use default or headroom" >&2; exit 2 ;;
esac
runs=runs/preregistered/$testbed
if [ ! -e "$runs" ]; then
  mkdir -p runs/preregistered
  ln -s "$frozen/$runs" "$runs"
fi
status=$(tracerl compare --methods grpo,pcl,trace --seeds "$seeds" --out "$runs" --config "$config" \
  --set run.num_steps=24 --status)
complete=$(grep -cE "^\| (grpo|pcl|trace) \| $planned of $planned \|" <<< "$status" || true)
if [ "$complete" != 3 ]; then
  echo "$status" >&2
  echo "read_preregistered: $testbed is not complete ($planned seeds of each method planned); not read" >&2
  exit 1
fi
(cd "$frozen" && PYTHONPATH="$frozen/src" benchmarks/preregistered.sh "$testbed" "$seeds" --report-only)
studies/preregistered.sh "$testbed" "$seeds" --report-only
mine=studies/preregistered-$testbed
theirs=$frozen/benchmarks/results/preregistered-$testbed
python studies/same_report.py "$theirs/compare.json" "$mine/compare.json"
python studies/same_report.py "$theirs/vs-pcl/compare.json" "$mine/vs-pcl/compare.json"
python studies/preregistered_facts.py "$mine" --out "$mine/facts.md" > /dev/null
case "$seeds" in *-*) first=${seeds%-*}; last=${seeds#*-} ;; *) first=0; last=$((seeds - 1)) ;; esac
# only runs with every step's trees: a run restored from kept records has the first step's alone (amendment 9)
trace_runs=$(for s in $(seq "$first" "$last"); do
  [ -e "$runs/trace-seed$s/trees/step-000002.json.gz" ] && echo "$runs/trace-seed$s"; done || true)
if [ -n "$trace_runs" ]; then
  echo "read_preregistered: stage 2 (exploratory) over the trace runs with their trees: seeds" \
    $(for r in $trace_runs; do echo "${r##*seed}"; done)
  tracerl bench stage2 $trace_runs --out "$mine/stage2.md" > /dev/null
  python studies/stage2_calibration.py $trace_runs --out "$mine/stage2-calibration.md" > /dev/null
else
  echo "read_preregistered: no trace run here has its trees (restored from records); stage 2 not read"
fi
echo "read_preregistered: $testbed read; the frozen tree's reports in $theirs, this tree's and the verdict in $mine"
