#!/usr/bin/env bash
# Math's confirmatory table over builds (studies/preregistration.md, amendments 13, 15 and 16): grpo, pcl, trace,
# knapsack_rl, posterior and trace-root-only on new builds of configs/math.toml (policy.embedded.seed 1..B), one
# training seed each,
# every run trained to 190,000 sampled tokens (run.num_steps = 80 a cap), evaluated at the start and at the stop,
# coupled, on QUESTIONS x SAMPLES (chosen from the pilot's split by amendment 7's rule: at least 512 x 4).
#
#   studies/math_confirm.sh BUILDS QUESTIONS SAMPLES [tracerl compare arguments...]
#
# BUILDS: a space-separated list of build seeds. Two lanes keep both cores busy, each building and then training
# its own builds one run at a time:
#   studies/math_confirm.sh "1 3 5 7 9" 1024 4 &
#   studies/math_confirm.sh "2 4 6 8 10" 1024 4 &
# Resumable: finished runs are kept and a run stopped part-way resumes from its last checkpoint when the same line
# runs again. Runs go to runs/math-confirm/build<k>/, with the build's report against grpo in build<k>/vs-grpo/
# and against pcl in build<k>/vs-pcl/ (the reader, studies/math_confirm.py, reads both); each finished build's
# six runs are kept in studies/math-confirm/build<k>.tar.xz (studies/run_records.py, without the build: it is
# made again from its seed and checked against the weights hash the runs hold).
# REPORTS=1 trains nothing: each listed build's kept runs are put back from its archive into runs/math-confirm-kept/
# (on any machine), its two reports written as above, and what the reader reads of it kept in
# studies/math-confirm/reports/build<k>/ (both reports, each run's saved_on.json); how the table is read once all of
# its builds are kept, wherever they trained (the proxy check reads runs/math-confirm-kept):
#   REPORTS=1 studies/math_confirm.sh "$(seq -s ' ' 1 12)" 1024 4
#   python studies/math_confirm.py studies/math-confirm/reports --funcall-p P --out studies/math-confirm/primary.md
set -euo pipefail
cd "$(dirname "$0")/.."
builds=${1:?"name the builds, e.g. \"1 3 5\""}
questions=${2:?"name the held-out questions per evaluation (the pilot's split chooses them; at least 512)"}
samples=${3:?"name the samples per question (at least 4)"}
shift 3
if (( questions < 512 || samples < 4 )); then
  echo "math_confirm: $questions x $samples is below amendment 13's floor of 512 questions x 4 samples" >&2
  exit 2
fi
methods=grpo,pcl,trace,knapsack_rl,posterior,trace-root-only
common=(--methods "$methods" --seeds 0-0 --config configs/math.toml
        --set run.total_token_budget=190000 --set run.num_steps=80 --set run.eval_every=0
        --set run.eval_prompts="$questions" --set run.eval_samples="$samples" --set run.eval_coupled=true
        --set run.num_threads=1 --set run.tensorboard=false --jobs 1)
mkdir -p studies/math-confirm
for k in $builds; do
  out=runs/math-confirm/build$k
  if [ "${REPORTS:-0}" = 1 ]; then
    out=runs/math-confirm-kept/build$k  # the kept records alone, never a lane's folder
    python studies/run_records.py restore "studies/math-confirm/build$k.tar.xz" "$out"
  else
    tracerl warmstart --config configs/math.toml --set policy.embedded.seed="$k" --keep
    tracerl compare --out "$out" --baseline grpo "${common[@]}" --set policy.embedded.seed="$k" "$@"
  fi
  for base in pcl grpo; do  # the report against grpo last, so build<k>/compare.md is the registered question's
    tracerl compare --out "$out" --baseline "$base" "${common[@]}" --set policy.embedded.seed="$k" "$@" --report-only
    mkdir -p "$out/vs-$base" && cp "$out/compare.md" "$out/compare.json" "$out/vs-$base/"
  done
  if [ "${REPORTS:-0}" = 1 ]; then
    kept=studies/math-confirm/reports/build$k
    for base in pcl grpo; do
      mkdir -p "$kept/vs-$base" && cp "$out/vs-$base/compare.md" "$out/vs-$base/compare.json" "$kept/vs-$base/"
    done
    for m in ${methods//,/ }; do
      mkdir -p "$kept/$m-seed0" && cp "$out/$m-seed0/saved_on.json" "$kept/$m-seed0/"
    done
  else
    python studies/run_records.py save "$out" "studies/math-confirm/build$k.tar.xz" --no-build --methods "$methods"
  fi
done
where=""
[ "${REPORTS:-0}" = 1 ] && where=", their reports in studies/math-confirm/reports/"
echo "math_confirm: builds $builds in runs/math-confirm$([ "${REPORTS:-0}" = 1 ] && echo -kept)/$where"
