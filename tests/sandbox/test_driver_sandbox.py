"""Model-written code through the whole driver: the math expert solves its split, hostile code is contained."""

import json
import os

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("reasoning_gym")

from tracerl.core.growth import grow_trees  # noqa: E402
from tracerl.core.ledger import make_prices  # noqa: E402
from tracerl.core.methods import AllocationConfig, get_method  # noqa: E402
from tracerl.io.domains.math import MathDomain  # noqa: E402
from tracerl.io.rollout.driver import DriverLimits, ReActDriver  # noqa: E402
from tracerl.io.sandbox import SandboxLimits  # noqa: E402

from helpers import expert_engine, make_renderer  # noqa: E402

# a loop ends by its CPU limit; the expert's programs end by themselves, and no loaded machine nears the wall clock
DOMAIN = MathDomain(limits=SandboxLimits(wall_seconds=30.0, cpu_seconds=2, memory_mb=256))
ROWS = DOMAIN.rows("test", 12, seed=0)


@pytest.fixture(scope="module")
def renderer():
    return make_renderer([r["prompt"][-1]["content"] for r in ROWS] + ["print(1 + 2)"] * 20)


def test_math_expert_solves_its_split_through_the_driver(renderer):
    driver = ReActDriver(expert_engine(renderer, ROWS, DOMAIN), renderer, DOMAIN)
    driver.set_rows(ROWS)
    trees, _ = driver.run_roots(list(range(len(ROWS))), [1] * len(ROWS))
    assert np.mean([t.rewards().mean() for t in trees]) >= 0.95, dict(driver.counters)


def test_hostile_code_is_contained_and_the_step_completes(renderer, tmp_path):
    sentinel = tmp_path / "keep.txt"
    sentinel.write_text("host file")
    target = tmp_path / "pwned.txt"
    hostile = ["while True:\n    pass\n", "import os\nwhile True:\n    os.fork()\n", "x = bytearray(10**10)\n",
               f"open({str(target)!r}, 'w').write('pwned')\n", f"import os\nos.remove({str(sentinel)!r})\n",
               "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)\n",
               "import os\nos.kill(os.getppid(), 9)\n", "print('x' * 10**8)\n"]

    def attack(rng):
        code = hostile[rng.randrange(len(hostile))]
        return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"

    engine = expert_engine(renderer, ROWS[:8], DOMAIN, noise=0.6, wrong=attack)
    driver = ReActDriver(engine, renderer, DOMAIN, limits=DriverLimits(max_turns=4))
    pool = driver.set_rows(ROWS[:8])
    config = AllocationConfig(num_prompts=2, rollouts_per_prompt=4, pool_factor=4, expand_rounds=1)
    prices = make_prices(config)
    ledger = prices.ledger()
    grown = grow_trees(get_method("trace"), config, pool, lambda hs: np.full(len(hs), 0.5), driver, ledger,
                       np.random.default_rng(0), prices)
    assert os.getpid() and grown.trees, "the step completed in this process"
    assert driver.counters["rollout/tool_errors"] > 0
    assert sentinel.read_text() == "host file" and not target.exists()
    assert all(n.reward is not None for t in grown.trees for n in t.nodes if not t.children[n.node_id] and n.depth)
