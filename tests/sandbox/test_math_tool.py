"""Math environment against the real sandbox: the expert solves the test split, tool errors, snapshot/restore."""

import json

import numpy as np
import pytest

from tracerl.io.domains.math import MathDomain, MathEnv
from tracerl.io.sandbox import SandboxLimits


def call(code):
    return f"<tool_call>{json.dumps({'name': 'python', 'arguments': {'code': code}})}</tool_call>"


@pytest.fixture(scope="module")
def domain():
    return MathDomain()


def run_expert(domain, row, rng, max_turns=4):
    env = domain.make_env()
    env.reset(row)
    turns = []
    for _ in range(max_turns):
        action = domain.expert_turn(row, turns, rng)
        result = env.step(action)
        if result.done:
            return result.reward, turns
        assert not result.tool_error, f"expert's tool call failed on {row['prompt'][-1]['content']!r}: {result}"
        turns.append((action, result.observation))
    return 0.0, turns


def test_expert_solves_the_test_split_with_the_real_sandbox(domain):
    rows = domain.rows("test", 40, seed=0)
    rng = np.random.default_rng(0)
    rewards, failures = [], []
    for row in rows:
        reward, turns = run_expert(domain, row, rng)
        rewards.append(reward)
        if reward < 1:
            failures.append((row["prompt"][-1]["content"][-80:], row["reward_model"]["ground_truth"], turns))
    assert len({r["extra_info"]["generator"] for r in rows}) == 3
    assert np.mean(rewards) >= 0.95, f"expert reward {np.mean(rewards):.3f}; failures: {failures[:3]}"


def test_program_output_errors_and_timeouts_are_observations():
    # the loop ends by its CPU limit; a wall clock no loaded machine comes near for the calls that end by themselves
    env = MathEnv(limits=SandboxLimits(wall_seconds=30.0, cpu_seconds=1))
    env.reset(MathDomain(mix={"chain_sum": 1.0}).rows("test", 1, seed=0)[0])
    ok = env.step(call("print(6 * 7)"))
    assert ok.observation == "42" and not ok.tool_error and not ok.done
    crashed = env.step(call("print(1 / 0)"))
    assert crashed.tool_error and "ZeroDivisionError" in crashed.observation, crashed
    slow = env.step(call("while True: pass"))
    assert slow.tool_error and "error:" in slow.observation, slow
    assert env.state["num_python_calls"] == 3


def test_snapshot_restore_resumes_the_prefix():
    row = MathDomain(mix={"chain_sum": 1.0}).rows("test", 1, seed=0)[0]
    env = MathEnv()
    env.reset(row)
    env.step(call("print(1)"))
    saved = env.snapshot()
    env.step(call("print(2)"))
    env.step(call("print(3)"))
    assert env.state["num_python_calls"] == 3
    env.restore(saved)
    assert env.state["num_python_calls"] == 1
    env.step(call("print(4)"))
    assert env.state["num_python_calls"] == 2 and saved == {"num_python_calls": 1}, "restore must not alias"
    truth = row["reward_model"]["ground_truth"]
    assert env.step(f"<answer>{truth}</answer>").reward == 1.0


def test_prefetched_programs_give_what_stepping_them_gives():
    """The driver prefetches every turn of a batch, so the domain's pool runs their sandboxes side by side; what
    each step returns is what an environment without a pool returns, errors included, and nothing is left over."""
    domain = MathDomain(mix={"chain_sum": 1.0}, limits=SandboxLimits(wall_seconds=30.0, cpu_seconds=1))
    row = domain.rows("test", 1, seed=0)[0]
    programs = ["print(6 * 7)", "print(1 / 0)", "import os; print(os.getpid() > 0)", "print('x' * 3)"]
    plain, pooled = MathEnv(limits=domain.limits), [domain.make_env() for _ in programs]
    plain.reset(row)
    for env, code in zip(pooled, programs):
        env.reset(row)
        env.prefetch(call(code))
    for env, code in zip(pooled, programs):
        got, want = env.step(call(code)), plain.step(call(code))
        assert (got.observation, got.tool_error) == (want.observation, want.tool_error), code
        assert env._prefetched == {}
    other = domain.make_env()
    other.reset(row)
    other.prefetch(call("print(1)"))
    assert other.step(call("print(2)")).observation == "2", "a step runs its own program, not the prefetched one"
    other.prefetch("<answer>3</answer>")  # not a program: nothing to start
    assert list(other._prefetched) == ["print(1)"]


def test_a_domain_with_its_pool_still_pickles_and_fingerprints_as_its_options():
    import pickle

    domain = MathDomain(mix={"chain_sum": 1.0})
    before = domain.fingerprint()
    domain.make_env()  # makes the pool
    copy = pickle.loads(pickle.dumps(domain))
    assert copy._pool is None and copy.fingerprint() == before == domain.fingerprint()
