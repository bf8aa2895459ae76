#!/usr/bin/env bash
# The catalogue task (catalogue/, written from the docs only): 30 steps of `trace` from the build `tracerl warmstart
# --search` chose (sft_steps = 1400) and, for contrast, from the default warm start (3000 steps), at the config's
# optim.lr (2e-3, copied from the inventory example), and from both at the default optim.lr (5e-4).
# Held-out success on all 200 test questions x 4 samples before and after. Resumable (--resume: a finished run is
# only read again).
#   studies/warmstart-regime/catalogue_runs.sh            (the seeds of README.md's table)
set -euo pipefail
cd "$(dirname "$0")/../.."
config=studies/warmstart-regime/catalogue/config.toml
mkdir -p runs/warmstart
python studies/warmstart-regime/catalogue/make_data.py > /dev/null
run() {  # NAME SEED OVERRIDES...
  local name=$1 seed=$2
  shift 2
  tracerl train --config "$config" --set run.seed="$seed" --set run.progress=false --set run.tensorboard=false \
    --out "runs/warmstart/$name-seed$seed" --resume "$@" > "runs/warmstart/$name-seed$seed.log" 2>&1
}
for seed in 0 1 2 3; do
  run catalogue-1400 "$seed" --set policy.embedded.sft_steps=1400
  run catalogue-3000 "$seed"
done
for seed in 0 1 2 3 4; do
  run catalogue-1400-lr5e-4 "$seed" --set policy.embedded.sft_steps=1400 --set optim.lr=5e-4
  run catalogue-3000-lr5e-4 "$seed" --set optim.lr=5e-4
done
grep -h "^improvement" runs/warmstart/catalogue-*.log
