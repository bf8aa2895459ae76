#!/usr/bin/env bash
# The pre-registered comparison (studies/preregistration.md): grpo, pcl and trace on one testbed, 24 steps of 128
# units, evaluated every 2 steps on 512 held-out questions x 4 samples (the same for every method of a seed), each
# run's starting weights recorded; then two reports over the same runs, against grpo and against pcl, and the
# pre-registered decision rule applied to them (tracerl verdict: primary.md).
#
#   studies/preregistered.sh default  [SEEDS] [tracerl compare arguments...]   configs/trace.toml
#   studies/preregistered.sh headroom [SEEDS] [tracerl compare arguments...]   configs/trace-headroom.toml
#
# SEEDS as for tracerl compare: a count (30: seeds 0..29), a list (0,3) or a range (100-104, the headroom pilot).
# Further arguments go to `tracerl compare`: `--jobs 16` trains 16 runs at a time, `--set run.eval_prompts=256`
# applies the pre-registered rule for fewer questions, `--report-only` writes the reports alone.
# The runs go to runs/preregistered/<testbed>/ and the reports are copied to studies/preregistered-<testbed>/
# (compare.md, compare.json and the plots, against grpo) and .../vs-pcl/ (compare.md and compare.json, against pcl).
set -euo pipefail
cd "$(dirname "$0")/.."
testbed=${1:?"name a testbed: default or headroom"}
seeds=${2:-30}
shift $(( $# < 2 ? $# : 2 ))
case "$testbed" in
  default) config=configs/trace.toml; planned=30 ;;  # seed counts of preregistration.md
  headroom) config=configs/trace-headroom.toml; planned=41 ;;
  *) echo "unknown testbed $testbed: use default or headroom" >&2; exit 2 ;;
esac
common=(--config "$config" --set run.num_steps=24 --set run.eval_every=2 --set run.eval_prompts=512
        --set run.eval_samples=4 --set run.num_threads=1 --set run.tensorboard=false)
out=runs/preregistered/$testbed
dest=studies/preregistered-$testbed
tracerl compare --methods grpo,pcl,trace --seeds "$seeds" --baseline grpo --out "$out" "${common[@]}" "$@"
mkdir -p "$dest/vs-pcl"
cp "$out"/compare.md "$out"/compare.json "$out"/*.png "$dest"/
tracerl compare --methods grpo,pcl,trace --seeds "$seeds" --baseline pcl --out "$out" "${common[@]}" "$@" \
    --report-only
cp "$out"/compare.md "$out"/compare.json "$dest"/vs-pcl/  # the plots do not depend on the baseline: once, above
tracerl verdict "$dest" "$dest/vs-pcl" --planned-seeds "$planned" --out "$dest" > /dev/null
echo "preregistered: $testbed -> $dest (against grpo), $dest/vs-pcl (against pcl), $dest/primary.md (the verdict)"
