#!/usr/bin/env bash
# The domains at equal tokens (studies/preregistration.md, "Other domains at equal tokens, with power"): grpo, pcl
# and trace on math with a code tool or on function calling, every run trained to the same sampled-token budget,
# evaluated at the start and at the stop on 1,024 held-out questions x 4 samples with coupled sampling.
#
#   studies/domains_equal_tokens.sh math|funcall [SEEDS] [tracerl compare arguments...]
#
# SEEDS as for tracerl compare (100-105: the pilot). Further arguments go to `tracerl compare` (`--jobs 2`,
# `--report-only`, `--status`). The runs go to runs/domains-equal-tokens/<domain>/ and the report to
# studies/domain-<domain>-equal-tokens/.
set -euo pipefail
cd "$(dirname "$0")/.."
domain=${1:?"name a domain: math or funcall"}
seeds=${2:-100-105}
shift $(( $# < 2 ? $# : 2 ))
case "$domain" in
  math) budget=190000 ;;  # 30 of grpo's steps at 6,291 tokens a step (studies/domain-math/)
  funcall) budget=175000 ;;  # 30 of grpo's steps at 5,754 tokens a step (studies/domain-funcall/)
  *) echo "unknown domain $domain: use math or funcall" >&2; exit 2 ;;
esac
out=runs/domains-equal-tokens/$domain
dest=studies/domain-$domain-equal-tokens
tracerl compare --methods grpo,pcl,trace --seeds "$seeds" --baseline grpo --out "$out" --config "configs/$domain.toml" \
    --set run.total_token_budget=$budget --set run.num_steps=80 --set run.eval_every=0 --set run.eval_prompts=1024 \
    --set run.eval_samples=4 --set run.eval_coupled=true --set run.num_threads=1 --set run.tensorboard=false "$@"
case " $* " in *" --status "*) exit 0 ;; esac
mkdir -p "$dest"
cp "$out"/compare.md "$out"/compare.json "$out"/*.png "$dest"/
echo "domains at equal tokens: $domain -> $dest"
