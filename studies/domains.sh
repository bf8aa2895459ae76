#!/usr/bin/env bash
# The methods in the paper's other domains on the embedded policy (studies/preregistration.md, "Other domains"):
# grpo, pcl and trace on math with a code tool or on function calling, 12 steps of 128 units, evaluated every 3 steps
# on 256 held-out questions x 4 samples (the same for every method of a seed), each run's starting weights recorded;
# then the report against grpo, copied to studies/domain-<domain>/.
#
#   studies/domains.sh math    [SEEDS] [tracerl compare arguments...]   configs/math.toml
#   studies/domains.sh funcall [SEEDS] [tracerl compare arguments...]   configs/funcall.toml
#
# SEEDS as for tracerl compare (default 8: seeds 0..7). Resumable: run it again and it finishes what is missing;
# `--report-only` writes the report over the seeds complete so far.
set -euo pipefail
cd "$(dirname "$0")/.."
domain=${1:?"name a domain: math or funcall"}
seeds=${2:-8}
shift $(( $# < 2 ? $# : 2 ))
case "$domain" in
  math|funcall) config=configs/$domain.toml ;;
  *) echo "unknown domain $domain: use math or funcall" >&2; exit 2 ;;
esac
out=runs/domains/$domain
dest=studies/domain-$domain
tracerl compare --methods grpo,pcl,trace --seeds "$seeds" --baseline grpo --out "$out" --config "$config" \
    --set run.num_steps=12 --set run.eval_every=3 --set run.eval_prompts=256 --set run.eval_samples=4 \
    --set run.num_threads=1 --set run.tensorboard=false "$@"
mkdir -p "$dest"
cp "$out"/compare.md "$out"/compare.json "$out"/*.png "$dest"/
echo "domains: $domain -> $dest"
