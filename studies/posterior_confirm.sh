#!/usr/bin/env bash
# The confirmatory table of `posterior` against `pcl` and `knapsack_rl` (studies/preregistration.md, its last section):
# pcl, knapsack_rl, posterior and trace, and (amendment 14) grpo and trace-root-only, on new builds of the headroom
# testbed (policy.embedded.seed 5-28), one training seed each, every run trained to 130,000 sampled tokens, 512
# held-out questions x 8 coupled samples at step 0, step 20 and the stop. Each build's report against pcl is
# build<k>/compare.json, against grpo build<k>/vs-grpo/compare.json.
#
#   studies/posterior_confirm.sh [BUILDS] [tracerl compare arguments...]   (BUILDS: default "5 6 ... 28")
#   DESIGN=root-only studies/posterior_confirm.sh [BUILDS] ...  (BUILDS: default "29 30 ... 52")
#
# DESIGN=root-only runs the next registered table the same way (studies/preregistration.md, `trace-root-only`'s
# section): pcl, knapsack_rl, trace-root-only and grpo on builds 29-52, into runs/root-only-confirm/ and
# studies/root-only-confirm/; read by `python studies/posterior_confirm.py runs/root-only-confirm --design root-only`.
# DESIGN=funcall-pilot runs the pilot of function calling's table over builds (the plan's section on `trace` in
# function calling over builds): pcl, knapsack_rl, trace, grpo and trace-root-only on builds 101-106 of
# configs/funcall.toml, every run to 175,000 sampled tokens, evaluated at the start and the stop on 1,024 held-out
# questions x 4 coupled samples, into runs/funcall-builds-pilot/ and studies/funcall-builds-pilot/; read by
# `python studies/posterior_confirm.py runs/funcall-builds-pilot --design funcall-pilot`. DESIGN=funcall runs that
# table itself the same way on builds 1-24 (B, appended to the plan from the pilot), into runs/funcall-builds/ and
# studies/funcall-builds/; read by `python studies/posterior_confirm.py runs/funcall-builds --design funcall`.
#
# Two lanes keep both cores busy, each building and then training its own builds one run at a time:
#   studies/posterior_confirm.sh "5 7 9 11 13 15 17 19 21 23 25 27" &
#   studies/posterior_confirm.sh "6 8 10 12 14 16 18 20 22 24 26 28" &
# REPORTS=1 trains nothing: it puts each listed build's kept runs back from studies/<table>/build<k>.tar.xz into
# runs/<table>-kept/build<k> (on any machine: a report reads the runs' records, not the build), writes its two
# reports as a lane does, and keeps what the reader reads of it in studies/<table>/reports/build<k>/ (the two
# reports and each run's saved_on.json, which names its machine); the way a table over builds is read once all of
# its builds are kept, wherever they trained:
#   REPORTS=1 DESIGN=funcall studies/posterior_confirm.sh "$(seq -s ' ' 1 24)"
#   python studies/posterior_confirm.py studies/funcall-builds/reports --design funcall \
#     --out studies/funcall-builds/primary.md
#
# Resumable: finished runs are kept and a partial table continues when the same line runs again. Runs go to
# runs/<table>/build<k>/; each finished build's runs are kept as records in studies/<table>/build<k>.tar.xz
# (studies/run_records.py, without the build: it is made again from its seed and checked against the weights hash
# the runs hold). `python studies/posterior_confirm.py runs/<table> [--design root-only]` reads them once all 24
# builds are kept.
set -euo pipefail
cd "$(dirname "$0")/.."
headroom=(--config configs/trace-headroom.toml
          --set run.num_steps=40 --set run.total_token_budget=130000 --set "run.eval_steps=[20]"
          --set run.eval_prompts=512 --set run.eval_samples=8 --set run.eval_coupled=true
          --set allocation.budget_unit=tokens --set allocation.token_budget=12800)
funcall=(--config configs/funcall.toml
         --set run.num_steps=80 --set run.total_token_budget=175000 --set run.eval_every=0
         --set run.eval_prompts=1024 --set run.eval_samples=4 --set run.eval_coupled=true)
case ${DESIGN:-posterior} in
  posterior) table=posterior-confirm first=5 count=24 methods=pcl,knapsack_rl,posterior,trace,grpo,trace-root-only
             settings=("${headroom[@]}") ;;
  root-only) table=root-only-confirm first=29 count=24 methods=pcl,knapsack_rl,trace-root-only,grpo
             settings=("${headroom[@]}") ;;
  funcall-pilot) table=funcall-builds-pilot first=101 count=6 methods=pcl,knapsack_rl,trace,grpo,trace-root-only
                 settings=("${funcall[@]}") ;;
  funcall) table=funcall-builds first=1 count=24 methods=pcl,knapsack_rl,trace,grpo,trace-root-only
           settings=("${funcall[@]}") ;;
  *) echo "posterior_confirm: DESIGN=$DESIGN is not a registered table (posterior, root-only, funcall-pilot or" \
          "funcall)" >&2
     exit 2 ;;
esac
builds=${1:-"$(seq -s ' ' "$first" $((first + count - 1)))"}
shift $(( $# < 1 ? $# : 1 ))
config=${settings[1]}
common=(--methods "$methods" --seeds 0-0 "${settings[@]}" --set run.num_threads=1 --set run.tensorboard=false --jobs 1)
mkdir -p "studies/$table"
for k in $builds; do
  out=runs/$table/build$k
  if [ "${REPORTS:-0}" = 1 ]; then
    out=runs/$table-kept/build$k  # the kept records alone, never a lane's folder
    python studies/run_records.py restore "studies/$table/build$k.tar.xz" "$out"
  else
    tracerl warmstart --config "$config" --set policy.embedded.seed="$k" --keep
    tracerl compare --out "$out" --baseline pcl "${common[@]}" --set policy.embedded.seed="$k" "$@"
  fi
  tracerl compare --out "$out" --baseline grpo "${common[@]}" --set policy.embedded.seed="$k" "$@" --report-only
  mkdir -p "$out/vs-grpo" && cp "$out/compare.md" "$out/compare.json" "$out/vs-grpo/"
  tracerl compare --out "$out" --baseline pcl "${common[@]}" --set policy.embedded.seed="$k" "$@" --report-only
  if [ "${REPORTS:-0}" = 1 ]; then
    kept=studies/$table/reports/build$k
    mkdir -p "$kept/vs-grpo"
    cp "$out/compare.md" "$out/compare.json" "$kept/"
    cp "$out/vs-grpo/compare.md" "$out/vs-grpo/compare.json" "$kept/vs-grpo/"
    for m in ${methods//,/ }; do
      mkdir -p "$kept/$m-seed0" && cp "$out/$m-seed0/saved_on.json" "$kept/$m-seed0/"
    done
  else
    python studies/run_records.py save "$out" "studies/$table/build$k.tar.xz" --no-build --methods "$methods"
  fi
done
where=""
[ "${REPORTS:-0}" = 1 ] && where=", their reports in studies/$table/reports/"
echo "posterior_confirm: builds $builds in runs/$table$([ "${REPORTS:-0}" = 1 ] && echo -kept)/$where"
