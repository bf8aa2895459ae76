#!/usr/bin/env bash
# The learning-gain tables on the default testbed (configs/trace.toml, the embedded policy), each one resumable
# `tracerl compare`: held-out success paired by seed and question, at equal budget units and at equal sampled
# tokens, with 95% confidence intervals; the regime of the baseline's first batch; informative samples per unit.
#
#   studies/learning_gain.sh methods [SEEDS]   grpo, pcl, treepo, trace                     (baseline grpo)
#   studies/learning_gain.sh values  [SEEDS]   trace's stage-1 value functions in training  (baseline grpo)
#   studies/learning_gain.sh stages  [SEEDS]   uniform or active stage 1 x uniform or active stage 2 (the paper's
#                                                 Table 1; baseline: both uniform)
#   studies/learning_gain.sh shape   [SEEDS]   root budget vs continuation width (root_share x stage2_width,
#                                                 the analogue of the paper's (1024, 2), (512, 6), (512, 2); baseline
#                                                 grpo)
#
# SEEDS is a count (5: seeds 0..4), a list (0,3) or a range (2-4); a run already finished is not trained again, so
# the table can be grown a few seeds at a time, and runs trained elsewhere can be dropped into the folder (a moved
# run resumes where it now is; on another machine or torch build the same seed can end on another path, 5 of 20
# runs in studies/learning-gain-methods/README.md, so a table's entries are best trained on one machine). Further
# arguments go to `tracerl compare`:
# `--jobs 16` trains 16 runs at a time (one core each), `--report-only` writes the report alone.
# The runs go to runs/learning-gain/<table>/ and the report (compare.md, compare.json, plots) is copied to
# studies/learning-gain-<table>/. On the 2-core CPU machine one run of 24 steps with its 4 evaluations
# of 512 questions x 4 samples takes about 4-5 minutes with one torch thread.
set -euo pipefail
cd "$(dirname "$0")/.."
table=${1:?"name a table: methods, values, stages or shape"}
seeds=${2:-5}
shift $(( $# < 2 ? $# : 2 ))
common=(--config configs/trace.toml --set run.num_steps=24 --set run.eval_every=8 --set run.eval_prompts=512
        --set run.eval_samples=4 --set run.num_threads=1 --set run.tensorboard=false)
case "$table" in
  methods) entries="grpo,pcl,treepo,trace"; baseline=grpo ;;
  values) entries="grpo,trace,trace[allocation.m_min=4],trace[allocation.root_value=knapsack_rl],trace[allocation.root_value=nonzero_adv]"
          baseline=grpo ;;
  stages) entries="trace-uniform,trace-prefix-only,trace-uniform-prefix,trace"; baseline=trace-uniform ;;
  shape) entries="grpo,trace,trace[allocation.root_share=0.75;allocation.stage2_width=2],trace[allocation.root_share=0.5;allocation.stage2_width=6;allocation.k_max=6],trace[allocation.root_share=0.5;allocation.stage2_width=2]"
         baseline=grpo ;;
  *) echo "unknown table $table: use methods, values, stages or shape" >&2; exit 2 ;;
esac
out=runs/learning-gain/$table
tracerl compare --methods "$entries" --seeds "$seeds" --baseline "$baseline" --out "$out" "${common[@]}" "$@"
dest=studies/learning-gain-$table
mkdir -p "$dest"
cp "$out"/compare.md "$out"/compare.json "$out"/*.png "$dest"/
echo "learning_gain: $table -> $dest"
