#!/usr/bin/env bash
# The adaptive samplers against grpo and pcl on the headroom testbed at equal sampled tokens: an exploratory table
# (studies/samplers-headroom/README.md states its plan). Every method's step buys the same expected sampled tokens
# (allocation.budget_unit=tokens, 12,800 a step in the ledger's tokens, which count observations: about 6 prompts x
# 8 rollouts; samplers-headroom/README.md, amendment 1), 24
# steps, held-out evaluation at steps 0, 8, 16 and 24 on 512 questions x 4 coupled samples (the same questions and
# random streams for every method of a seed).
#
#   studies/samplers.sh [SEEDS] [tracerl compare arguments...]     (SEEDS as for tracerl compare; default 8: 0-7)
#
# Runs resume: a partial table is continued by running the same line again. Runs go to runs/samplers/headroom/;
# the reports (against grpo, and against pcl in vs-pcl/) are copied to studies/samplers-headroom/.
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${1:-8}
shift $(( $# < 1 ? $# : 1 ))
methods=grpo,pcl,dapo,reinforce_ada,speed,pilot_commit,knapsack_rl
common=(--config configs/trace-headroom.toml --set run.num_steps=24 --set run.eval_every=8
        --set run.eval_prompts=512 --set run.eval_samples=4 --set run.eval_coupled=true
        --set allocation.budget_unit=tokens --set allocation.token_budget=12800
        --set run.num_threads=1 --set run.tensorboard=false)
out=runs/samplers/headroom
dest=studies/samplers-headroom
tracerl compare --methods "$methods" --seeds "$seeds" --baseline grpo --out "$out" "${common[@]}" "$@"
mkdir -p "$dest/vs-pcl"
cp "$out"/compare.md "$out"/compare.json "$out"/accuracy_vs_tokens.png "$dest"/
tracerl compare --methods "$methods" --seeds "$seeds" --baseline pcl --out "$out" "${common[@]}" "$@" --report-only
cp "$out"/compare.md "$out"/compare.json "$dest"/vs-pcl/
echo "samplers: headroom -> $dest (against grpo), $dest/vs-pcl (against pcl)"
