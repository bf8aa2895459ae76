"""Reward calls in a pool: weighted reward functions, results in the caller's order, a timeout that frees a process
worker, and the check that process workers can receive the functions."""

import time

import pytest

from tracerl.io.rewards import RewardError, RewardPool


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
    pool = RewardPool([slow_when_asked], workers=4, timeout_s=5)
    started = time.perf_counter()
    handles = [pool.submit(**call(str(i), sleep=0.3 - 0.1 * i)) for i in range(3)]
    assert [pool.result(h) for h in handles] == [1.0, 1.0, 1.0]
    assert time.perf_counter() - started < 0.6, "the calls ran one after another, not in the pool"
    assert pool.counts == {"calls": 3, "errors": 0, "timeouts": 0}


def test_a_timeout_in_a_process_worker_frees_the_worker():
    pool = RewardPool([slow_when_asked], workers=1, pool="process", timeout_s=0.3)
    try:
        with pytest.raises(RewardError, match="timed out after 0.3 s"):
            pool(**call("4", sleep=30))
        started = time.perf_counter()
        assert pool(**call("4", sleep=0)) == 1.0, "the one worker is free again"
        assert time.perf_counter() - started < 5
        assert pool.counts == {"calls": 2, "errors": 0, "timeouts": 1}
    finally:
        pool.close()


def test_process_workers_need_functions_they_can_import():
    with pytest.raises(ValueError, match="pickled.*module level"):
        RewardPool([lambda data_source, solution_str, ground_truth, extra_info=None: 1.0], pool="process")


def test_the_driver_scores_a_batch_of_answers_at_once(tmp_path):
    """The driver starts every answer's reward of a batch before it asks for any (`prefetch`): 6 answers of a
    reward that takes 0.3 s each are scored in well under 6 x 0.3 s, and each leaf gets its own reward."""
    pytest.importorskip("transformers")
    import json

    from helpers import make_renderer

    from tracerl.io.driver import ReActDriver
    from tracerl.io.scripted_engine import ScriptedEngine
    from tracerl.io.task import UserTask, UserTaskDomain

    def slow_exact(data_source, solution_str, ground_truth, extra_info=None):
        time.sleep(0.3)
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
    started = time.perf_counter()
    trees, _ = driver.run_roots([0, 1, 2], [2, 2, 2])
    assert time.perf_counter() - started < 6 * 0.3 * 0.6
    for i, tree in enumerate(trees):
        assert sorted(tree.rewards()) == [0.0, 1.0], (i, tree.rewards())
    assert driver.counters["rollout/reward_calls"] == 6


def test_a_reward_that_never_returns_does_not_keep_the_process_from_exiting():
    import subprocess
    import sys

    code = ("import time\nfrom tracerl.io.rewards import RewardError, RewardPool\n"
            "def hang(data_source, solution_str, ground_truth, extra_info=None):\n    time.sleep(600)\n"
            "try:\n    RewardPool([hang], timeout_s=0.2)(data_source='d', solution_str='s', ground_truth='g', "
            "extra_info={})\nexcept RewardError as err:\n    print(err)\n")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "timed out after 0.2 s" in done.stdout, done.stderr
    assert time.perf_counter() - started < 30, "the interpreter waited for the hung reward thread"
