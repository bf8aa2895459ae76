"""Reward calls in a pool: weighted reward functions, results in the caller's order, a timeout that frees a process
worker, and the check that process workers can receive the functions."""

import threading
import time

import pytest

from tracerl.io.env.rewards import RewardError, RewardPool

HANG_S = 60.0  # a deadline that only keeps a wait from hanging for ever


def exact(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str == ground_truth)


def length(data_source, solution_str, ground_truth, extra_info=None):
    return len(solution_str) / 10


def slow_when_asked(data_source, solution_str, ground_truth, extra_info=None):
    time.sleep(float(extra_info["sleep"]))
    return 1.0


def call(solution, truth="4", sleep=0.0):
    return {"data_source": "d", "solution_str": solution, "ground_truth": truth, "extra_info": {"sleep": sleep}}


def test_weighted_functions_are_summed():
    pool = RewardPool([exact, length], [0.5, 2.0], pool="none")
    assert pool(**call("4")) == pytest.approx(0.5 * 1.0 + 2.0 * 0.1)
    assert pool(**call("44")) == pytest.approx(2.0 * 0.2)
    with pytest.raises(ValueError, match="one weight per function"):
        RewardPool([exact, length], [1.0])


def test_results_come_back_in_the_order_they_are_asked_for():
    """Call i returns only after call i + 1 has: the three run in the pool at once (one after another, call 0 would
    wait for ever), finish last to first, and come back first to last."""
    finished = [threading.Event() for _ in range(3)]

    def after_the_next(data_source, solution_str, ground_truth, extra_info=None):
        i = int(solution_str)
        if i + 1 < len(finished) and not finished[i + 1].wait(HANG_S):
            raise TimeoutError(f"call {i + 1} did not finish while call {i} waited: the calls did not run at once")
        finished[i].set()
        return float(i)
    pool = RewardPool([after_the_next], workers=4, timeout_s=2 * HANG_S)
    handles = [pool.submit(**call(str(i))) for i in range(3)]
    assert [pool.result(h) for h in handles] == [0.0, 1.0, 2.0]
    assert pool.counts == {"calls": 3, "errors": 0, "timeouts": 0}


def test_a_timeout_in_a_process_worker_frees_the_worker():
    pool = RewardPool([slow_when_asked], workers=1, pool="process", timeout_s=0.3)
    try:
        with pytest.raises(RewardError, match="timed out after 0.3 s"):
            pool(**call("4", sleep=30))
        # with one worker, this call runs only if the alarm freed it from the 30 s sleep (the wait here is 5.3 s)
        assert pool(**call("4", sleep=0)) == 1.0, "the one worker is free again"
        assert pool.counts == {"calls": 2, "errors": 0, "timeouts": 1}
    finally:
        pool.close()


def test_process_workers_need_functions_they_can_import():
    with pytest.raises(ValueError, match="pickled.*module level"):
        RewardPool([lambda data_source, solution_str, ground_truth, extra_info=None: 1.0], pool="process")


def test_the_driver_scores_a_batch_of_answers_at_once(tmp_path):
    """The driver starts every answer's reward of a batch before it asks for any (`prefetch`): the 6 rewards of a
    batch all wait at one barrier, which opens only when all 6 run at once, and each leaf gets its own reward."""
    pytest.importorskip("transformers")
    import json

    from helpers import make_renderer

    from tracerl.io.rollout.driver import ReActDriver
    from tracerl.io.rollout.scripted_engine import ScriptedEngine
    from tracerl.io.env.task import UserTask, UserTaskDomain

    all_six = threading.Barrier(6)

    def slow_exact(data_source, solution_str, ground_truth, extra_info=None):
        all_six.wait(HANG_S)  # BrokenBarrierError (a failed leaf) unless the six run side by side
        return float(solution_str.strip() == ground_truth)
    rows = [{"prompt": [{"role": "user", "content": f"say {i}"}], "reward_model": {"ground_truth": str(i % 2)}}
            for i in range(3)]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    domain = UserTaskDomain(UserTask(tools=[], compute_score=slow_exact, train_files=[str(path)], reward_workers=8))
    renderer = make_renderer(["say 0 <answer>1</answer>"] * 20, vocab_size=300)

    def script(prefix, sample_index, rng):
        return renderer.encode(f"<answer>{sample_index % 2}</answer>") + [renderer.stop_token_ids[0]]
    driver = ReActDriver(ScriptedEngine(script), renderer, domain)
    driver.set_rows(domain.rows("train", 3))
    trees, _ = driver.run_roots([0, 1, 2], [2, 2, 2])
    assert driver.counters["rollout/reward_errors"] == 0, dict(driver.counters)
    for i, tree in enumerate(trees):
        assert sorted(tree.rewards()) == [0.0, 1.0], (i, tree.rewards())
    assert driver.counters["rollout/reward_calls"] == 6


def test_a_reward_that_never_returns_does_not_keep_the_process_from_exiting():
    import subprocess
    import sys

    code = ("import time\nfrom tracerl.io.env.rewards import RewardError, RewardPool\n"
            "def hang(data_source, solution_str, ground_truth, extra_info=None):\n    time.sleep(600)\n"
            "try:\n    RewardPool([hang], timeout_s=0.2)(data_source='d', solution_str='s', ground_truth='g', "
            "extra_info={})\nexcept RewardError as err:\n    print(err)\n")
    try:  # the hung reward sleeps 600 s: an interpreter that waited for its thread would still be running
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=2 * HANG_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"timeout: the interpreter waited for the hung reward thread ({2 * HANG_S:g} s and running)")
    assert "timed out after 0.2 s" in done.stdout, done.stderr
