#!/usr/bin/env bash
# The CUDA path in one short run, for a GPU machine with torch and transformers but no network (README.md here,
# "A Qwen3-0.6B-sized check without downloads"): a random-weight model of Qwen3-0.6B's architecture, built from its
# config; one TRACE training step on math (train_step_math.py) in bfloat16 mixed precision and in float32; then the
# transformers engine alone on a step-sized tree workload (engine_throughput.py) in both precisions. Each stage has
# its own time limit (STEP_TIMEOUT, ENGINE_TIMEOUT: 200 s each; a float32 step took 83 s on an H200 and 75 s on an
# H100, and the engine's workload is sized to ~25 s), so one that stalls still leaves the others' figures. STAGES
# ("train engine") picks the stages and their order, PRECISIONS ("bfloat16 float32") the precisions in each; JSON
# results go to $OUT (default /tmp/cuda-check), the log to $OUT/log.txt. STAGES may also name profile: the engine
# on a small workload under torch.profiler, to tell launch overhead from compute; stepprofile: one training step
# under cProfile, where a host-bound step's seconds go; recipe: the TRACE settings of docs/verl.md's GPU recipe in one
# step of tracerl's trainer (what verl itself runs there needs verl and vLLM). Every stage needs the math
# domain's packages (the smoke tokenizer is trained on its questions): give WHEELS on a machine without them.
#
#   WHEELS=.whl benchmarks/gpu/cuda_check.sh       # wheels of the math domain's packages, installed offline first
#   DEVICE=cpu MODEL_OVERRIDES='{"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 128,
#     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}' STEP_SET="allocation.num_prompts=2
#     data.max_tokens_per_turn=8 run.eval_prompts=2" ENGINE_ARGS="--num-prompts 2 --turn-tokens 4" \
#     benchmarks/gpu/cuda_check.sh                                      # a dry run on a CPU: does every stage run?
set -u
OUT=${OUT:-/tmp/cuda-check}
DEVICE=${DEVICE:-cuda}
WHEELS=${WHEELS:-}
SITE=/tmp/cuda-check-site
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
cd "$(dirname "$0")/../.."
if [ -n "$WHEELS" ]; then  # pure wheels, then pycosat from its source (it ships no wheel for every Python)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHEELS"/*.whl
    ls "$WHEELS"/*.tar.gz >/dev/null 2>&1 && { python3 -m pip install -q --no-index --no-deps --no-build-isolation \
        --target "$SITE" "$WHEELS"/*.tar.gz || echo "cuda_check: a source package did not build"; }
fi
export PYTHONWARNINGS=ignore::SyntaxWarning PYTHONPATH="$PWD/src:$SITE:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"

show() {  # the Markdown table of a script's JSON result
    python3 -c "import json, sys; sys.path.insert(0, 'benchmarks/gpu'); import $1 as m
print(m.to_markdown(json.load(open(sys.argv[1]))))" "$2" 2>/dev/null || echo "(no result in $2)"
}

MODEL=/tmp/qwen3-0.6b-random
python3 - "$MODEL" <<'PY'
import json, os, sys, time
sys.path.insert(0, "benchmarks/gpu")
from gpu_bench_common import build_sized_model_dir
t0 = time.perf_counter()
build_sized_model_dir(sys.argv[1], "qwen3-0.6b", **json.loads(os.environ.get("MODEL_OVERRIDES") or "{}"))
print(f"built {sys.argv[1]} in {time.perf_counter() - t0:.0f} s")
PY

# The step: the math preset's 16 prompts x 8 rollouts of budget, 4 turns of 128 tokens (a random model runs every
# turn to its limit), a small KL term so that the update trains every tree (a random model fails every rollout).
STEP=(--set data.max_turns=4 --set data.max_tokens_per_turn=128 --set data.max_tokens_per_rollout=1024
      --set optim.kl_coef=0.001 --set optim.micro_batch_rollouts=8 --set run.seed=0)
for kv in ${STEP_SET:-}; do STEP+=(--set "$kv"); done  # e.g. a dry run's smaller step
STAGES=${STAGES:-train engine}
PRECISIONS=${PRECISIONS:-bfloat16 float32}
train_stage() {  # one precision; more arguments go to train_step_math.py
    local precision=$1; shift
    echo "== train step, policy.precision=$precision $*"
    timeout ${STEP_TIMEOUT:-200} python3 benchmarks/gpu/train_step_math.py --model "$MODEL" --device "$DEVICE" --json "${STEP[@]}" \
        --set policy.precision=$precision "$@" > "$OUT/train-$precision$suffix.json" \
        || echo "cuda_check: train step $precision failed"
    show train_step_math "$OUT/train-$precision$suffix.json"
}
suffix=""
# The step under cProfile: where its host time goes, function by function, to $OUT/step-host-profile-<precision>.txt
# (the step's own figures, slowed by cProfile, to train-<precision>-host-profiled.json).
stepprofile_stage() {  # one precision
    suffix=-host-profiled train_stage "$1" --host-profile "$OUT/step-host-profile-$1.txt"
    head -n 30 "$OUT/step-host-profile-$1.txt" 2>/dev/null
}
# engine_throughput.py on the engine sized as the trainer builds it (64 rows a forward, a 65,536-token KV store:
# engine_throughput's own defaults, 128 rows and 131,072 tokens, ran out of an H100's 80 GB in float32), float32
# weights, prompts of 512 tokens, 4 rollouts each, 64-token observations, 2 continuations per node; the arguments
# after the precision shape the rest of the workload.
engine_run() {
    local precision=$1; shift
    timeout ${ENGINE_TIMEOUT:-200} python3 benchmarks/gpu/engine_throughput.py --model "$MODEL" --device "$DEVICE" \
        --dtype float32 --precision "$precision" --seed 0 --max-batch-size 64 --cache-tokens 65536 --prompt-tokens 512 \
        --rollouts 4 --observation-tokens 64 --continuations 2 "$@"
}
# The engine alone: 4 prompts, 4 turns of 128 tokens (7 calls, 256 samples, 32,768 generated tokens: ~25 s at the
# ~1,300 tokens/s of the H100's float32 step).
engine_stage() {  # one precision
    echo "== engine, $1 compute"
    engine_run "$1" --num-prompts 4 --turns 4 --turn-tokens 128 ${ENGINE_ARGS:-} --json > "$OUT/engine-$1.json" \
        || echo "cuda_check: engine $1 failed"
    show engine_throughput "$OUT/engine-$1.json"
}
# The engine under torch.profiler on a small workload (1 prompt, 2 turns of 32 tokens): its operator tables, by
# device and by host time, to $OUT/profile-<precision>.txt; its timing includes the profiler's overhead.
profile_stage() {  # one precision
    echo "== engine under the profiler, $1 compute"
    engine_run "$1" --num-prompts 1 --turns 2 --turn-tokens 32 --profile "$OUT/profile-$1.txt" > /dev/null \
        || echo "cuda_check: profile $1 failed"
    head -n 24 "$OUT/profile-$1.txt" 2>/dev/null
}
# The GPU recipe of docs/verl.md ("GPU recipe: Qwen3 with vLLM on verl"), as far as a machine without verl and vLLM
# can take it: the recipe's TRACE settings (multihop, `trace`, 6 turns of up to 512 tokens, 8 rollouts per prompt,
# m_max 16; 16 prompts here, not the recipe's 128) in one step of tracerl's own trainer on this model, on the GPU:
# tracerl's allocation, tree growth and tree advantages at the recipe's shapes, and the step's time and memory. It
# cannot check what verl runs there (the FSDP actor, the vLLM server, the weight sync, TraceAgentLoopManager, which
# imports verl): `tests/verl` and `benchmarks/verl/vllm_rollout.py` check those on a CPU.
recipe_stage() {  # one precision
    suffix=-verl-recipe train_stage "$1" --config configs/trace.toml --set data.domain=multihop --set method=trace \
        --set data.max_turns=6 --set data.max_tokens_per_turn=512 --set data.max_tokens_per_rollout=8192 \
        --set allocation.rollouts_per_prompt=8 --set allocation.m_max=16 --set allocation.num_prompts=16 ${RECIPE_SET:-}
}
for stage in $STAGES; do
    case $stage in
        train|engine|profile|stepprofile|recipe) for precision in $PRECISIONS; do "${stage}_stage" "$precision"; done ;;
        *) echo "cuda_check: unknown stage '$stage' (STAGES takes train, engine, profile, stepprofile and recipe)"
           exit 2 ;;
    esac
done
echo "== done"
