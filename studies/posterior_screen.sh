#!/usr/bin/env bash
# The posterior screen (studies/posterior-screen/README.md): pcl, knapsack_rl and posterior on five builds of the
# headroom testbed (policy.embedded.seed 0-4), one training seed each, at equal expected sampled tokens per step.
#
#   studies/posterior_screen.sh [BUILDS] [tracerl compare arguments...]     (BUILDS: default "0 1 2 3 4")
#
# Resumable: finished runs are kept and a partial screen continues when the same line runs again. Runs go to
# runs/posterior-screen/build<k>/; `python studies/posterior_screen.py runs/posterior-screen` reads them.
set -euo pipefail
cd "$(dirname "$0")/.."
builds=${1:-"0 1 2 3 4"}
shift $(( $# < 1 ? $# : 1 ))
common=(--methods pcl,knapsack_rl,posterior --seeds 0-0 --baseline pcl --config configs/trace-headroom.toml
        --set run.num_steps=24 --set "run.eval_steps=[22]" --set run.eval_prompts=512 --set run.eval_samples=4
        --set run.eval_coupled=true --set allocation.budget_unit=tokens --set allocation.token_budget=12800
        --set run.num_threads=1 --set run.tensorboard=false --jobs 2)
for k in $builds; do
  tracerl warmstart --config configs/trace-headroom.toml --set policy.embedded.seed="$k" --keep
  tracerl compare --out "runs/posterior-screen/build$k" "${common[@]}" --set policy.embedded.seed="$k" "$@"
done
echo "posterior_screen: builds $builds in runs/posterior-screen/"
