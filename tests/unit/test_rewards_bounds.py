"""Reward code without a bound: a reward stuck where no signal reaches it is killed and its worker replaced, so the
next call does not time out behind it; a worker that dies is replaced; a thread stuck past its deadline does not
hold the next call; and every result that is not a finite number is a counted reward error, whatever its type.

Deadlines are 1 s against work of 1000 s or more; "killed" is proved by the worker's process being gone."""

import decimal
import os
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import finishes, gone

from tracerl.io.env.rewards import RewardError, RewardPool



# module level, so process workers can import them
def stuck(data_source, solution_str, ground_truth, extra_info=None):
    """Hangs the way `extra_info["how"]` says, after writing its pid; "quick" returns 1.0."""
    how = extra_info["how"]
    if how == "quick":
        return 1.0
    Path(extra_info["pid_file"]).write_text(str(os.getpid()))
    if how == "in_c":
        return float(sum(range(10**13)))  # one C call: no signal handler runs until it returns
    if how == "stubborn":
        while True:
            try:
                time.sleep(1000)
            except BaseException:  # noqa: BLE001 - the point: it swallows the timeout
                pass
    if how == "exit":
        os._exit(7)
    time.sleep(1000)
    return 1.0


def asking(how, tmp_path):
    return {"data_source": "d", "solution_str": "s", "ground_truth": "g",
            "extra_info": {"how": how, "pid_file": str(tmp_path / "pid.txt")}}


@pytest.mark.parametrize("how", ["in_c", "stubborn", "sleep"])
def test_a_stuck_process_reward_is_killed_and_the_next_call_does_not_wait_behind_it(tmp_path, how):
    pool = RewardPool([stuck], workers=1, pool="process", timeout_s=1.0)
    try:
        with pytest.raises(RewardError, match="timed out after 1 s") as caught:
            finishes(lambda: pool(**asking(how, tmp_path)))
        assert caught.value.metric == "rollout/reward_timeouts"
        pid = int((tmp_path / "pid.txt").read_text())
        assert pid != os.getpid() and gone(pid), f"the stuck worker {pid} was not killed"
        assert finishes(lambda: pool(**asking("quick", tmp_path))) == 1.0, "the next call waited behind the stuck one"
        assert pool.counts == {"calls": 2, "errors": 0, "timeouts": 1}
    finally:
        pool.close()


def test_a_process_worker_that_dies_is_a_counted_error_and_is_replaced(tmp_path):
    pool = RewardPool([stuck], workers=1, pool="process", timeout_s=60.0)
    try:
        with pytest.raises(RewardError) as caught:
            finishes(lambda: pool(**asking("exit", tmp_path)))
        assert caught.value.metric == "rollout/reward_errors" and "7" in str(caught.value), str(caught.value)
        assert finishes(lambda: pool(**asking("quick", tmp_path))) == 1.0
        assert pool.counts == {"calls": 2, "errors": 1, "timeouts": 0}
    finally:
        pool.close()


def test_a_thread_stuck_past_its_deadline_does_not_hold_the_next_call(tmp_path):
    pool = RewardPool([stuck], workers=1, pool="thread", timeout_s=1.0)
    with pytest.raises(RewardError, match="timed out"):
        finishes(lambda: pool(**asking("sleep", tmp_path)))
    assert finishes(lambda: pool(**asking("quick", tmp_path))) == 1.0, "the next call waited behind the stuck thread"
    assert pool.counts == {"calls": 2, "errors": 0, "timeouts": 1}


def returning(data_source, solution_str, ground_truth, extra_info=None):
    return extra_info["value"]


class Exploding:
    def __float__(self):
        raise ArithmeticError("no float")


BAD_VALUES = [10**400, -10**400, 10**5000, float("nan"), float("inf"), -float("inf"), np.float64("nan"), np.inf,
              decimal.Decimal("NaN"), decimal.Decimal("1e400"), {"score": 10**400}, {"score": float("nan")},
              {"score": "1.0"}, "1.0", None, [1.0], complex(1, 0), Exploding(), np.array([1.0, 2.0])]


@pytest.mark.filterwarnings("ignore:the reward function failed on")  # every call here fails, on purpose
@pytest.mark.parametrize("pool", ["none", "thread", "process"])
def test_every_result_that_is_not_a_finite_number_is_a_counted_reward_error(pool):
    rewards = RewardPool([returning], pool=pool, workers=2, timeout_s=60.0)
    values = BAD_VALUES if pool != "process" else [v for v in BAD_VALUES if not isinstance(v, Exploding)]
    try:
        for value in values:
            with pytest.raises(RewardError) as caught:
                finishes(lambda: rewards(data_source="d", solution_str="s", ground_truth="g",
                                         extra_info={"value": value}))
            assert caught.value.metric == "rollout/reward_errors", (value, caught.value.metric)
        assert rewards.counts == {"calls": len(values), "errors": len(values), "timeouts": 0}
        good = [1, 0.5, True, np.float32(0.25), decimal.Decimal("0.75"), {"score": 2}]
        assert [rewards(data_source="d", solution_str="s", ground_truth="g", extra_info={"value": v})
                for v in good] == [1.0, 0.5, 1.0, 0.25, 0.75, 2.0]
    finally:
        rewards.close()


def test_weights_cannot_make_a_finite_reward_infinite():
    rewards = RewardPool([returning], weights=[1e308], pool="none")
    with pytest.raises(RewardError, match="finite"):
        rewards(data_source="d", solution_str="s", ground_truth="g", extra_info={"value": 1e308})


@pytest.mark.parametrize("weights", [[float("nan")], [float("inf")], [10**400]])
def test_weights_that_are_not_finite_are_refused_at_load(weights):
    with pytest.raises(ValueError, match="reward_weights"):
        RewardPool([returning], weights=weights, pool="none")


# ---------------------------------------------------------------- more of the same class (written after the fix)

def test_abandoned_reward_threads_are_bounded(tmp_path, monkeypatch):
    import tracerl.io.env.user_code as user_code
    monkeypatch.setattr(user_code, "MAX_STUCK_THREADS", 2)
    pool = RewardPool([stuck], workers=2, pool="thread", timeout_s=1.0)
    for _ in range(2):
        with pytest.raises(RewardError, match="timed out"):
            finishes(lambda: pool(**asking("sleep", tmp_path)))
    with pytest.raises(RewardError, match="still run in threads") as caught:
        finishes(lambda: pool(**asking("quick", tmp_path)))
    assert caught.value.metric == "rollout/reward_errors"
    assert pool.counts == {"calls": 3, "errors": 1, "timeouts": 2}


def chatty(data_source, solution_str, ground_truth, extra_info=None):
    while True:
        print("reward debug line " * 20)


def test_a_process_reward_that_prints_forever_is_killed_and_its_printing_capped(capfd):
    pool = RewardPool([chatty], workers=1, pool="process", timeout_s=1.0)
    try:
        with pytest.raises(RewardError, match="timed out"):
            finishes(lambda: pool(data_source="d", solution_str="s", ground_truth="g", extra_info={}))
    finally:
        pool.close()
    out, err = capfd.readouterr()
    assert len(out) + len(err) < 1_000_000, f"the reward printed {len(out) + len(err)} characters"


def test_a_closed_pool_leaves_no_worker_process(tmp_path):
    pool = RewardPool([stuck], workers=1, pool="process", timeout_s=60.0)
    assert pool(**asking("quick", tmp_path)) == 1.0
    pids = [w.pid for w in pool._runner._slots.processes if w is not None]
    pool.close()
    assert pids and all(gone(pid) for pid in pids)
