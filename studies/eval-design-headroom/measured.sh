#!/usr/bin/env bash
# The evaluation design this folder's README projects, trained beside the registered one on one machine: one seed
# (200, in no table) of grpo, pcl and trace on the headroom testbed as the registered table trains them (24 steps, two
# runs at a time, one torch thread each), evaluated
#   - as registered (runs/eval-design/registered): every 2 steps, independent sampling;
#   - as projected (runs/eval-design/measured): where the primary reads (steps 20, 22, 24 and pcl's 18), at 0 and 12
#     for the curves, with coupled sampling.
# Their core-seconds side by side, and against the registered table's own runs:
#   python studies/eval-design-headroom/measured_cost.py runs/eval-design/measured --beside runs/eval-design/registered
#   studies/eval-design-headroom/measured.sh          (resumable)
set -euo pipefail
cd "$(dirname "$0")/../.."
common=(--methods grpo,pcl,trace --seeds 200-200 --baseline grpo --config configs/trace-headroom.toml
        --set run.num_steps=24 --set run.eval_prompts=512 --set run.eval_samples=4 --set run.num_threads=1
        --set run.tensorboard=false --jobs 2)
tracerl compare --out runs/eval-design/measured "${common[@]}" --set run.eval_every=12 \
  --set "run.eval_steps=[18,20,22]" --set run.eval_coupled=true
tracerl compare --out runs/eval-design/registered "${common[@]}" --set run.eval_every=2
