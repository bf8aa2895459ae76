"""The warm start's regime search: the ladder, when it stops and refines, what it chooses and says, and one real search
over tiny builds of the inventory example through `tracerl warmstart --search`."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tracerl.cli import main
from tracerl.policy.warmstart import MIXED_FLOOR, choose, ladder, next_steps, search, to_markdown

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "inventory"


def reading(mixed, mean, all_fail=None):
    all_fail = (1 - mixed) * (1 - mean) if all_fail is None else all_fail
    return {"mixed": mixed, "mean_success": mean, "all_fail": all_fail, "all_success": 1 - mixed - all_fail}


def walk(curve, steps_ladder):
    """The step counts the search builds, in order, when step count s reads curve(s)."""
    readings, order = {}, []
    while (steps := next_steps(readings, steps_ladder)) is not None:
        assert steps not in readings, f"{steps} built twice"
        readings[steps], order = curve(steps), order + [steps]
    return readings, order


def test_the_ladder_doubles_up_to_the_largest_step_count():
    assert ladder(250, 8000) == [250, 500, 1000, 2000, 4000, 8000]
    assert ladder(250, 7999) == [250, 500, 1000, 2000, 4000, 7999]
    assert ladder(250, 3000) == [250, 500, 1000, 2000, 3000]  # the largest count asked for is built
    assert ladder(100, 100) == [100]
    with pytest.raises(ValueError, match="--min-steps"):
        ladder(500, 250)


def test_the_search_stops_past_the_peak_and_refines_around_the_best():
    # mixed share peaks near 1,400 steps; mean success passes one half at 1,000
    curve = {250: reading(0.05, 0.01), 500: reading(0.30, 0.15), 1000: reading(0.80, 0.50),
             2000: reading(0.60, 0.80), 710: reading(0.60, 0.35), 1400: reading(0.85, 0.65)}
    readings, order = walk(curve.__getitem__, ladder(250, 8000))
    assert order == [250, 500, 1000, 2000, 710, 1400], "4,000 and 8,000 must not be built once past the peak"
    assert choose(readings, 8000, 250)["steps"] == 1400


def test_a_falling_share_below_one_half_success_does_not_stop_the_climb():
    """A dip while most questions still fail is noise or a plateau, not the peak: the search keeps going up."""
    curve = {250: reading(0.30, 0.10), 500: reading(0.20, 0.15), 1000: reading(0.70, 0.40), 2000: reading(0.50, 0.70),
             710: reading(0.5, 0.3), 1400: reading(0.6, 0.6)}
    readings, order = walk(curve.__getitem__, ladder(250, 2000))
    assert order[:4] == [250, 500, 1000, 2000]
    assert choose(readings, 2000, 250)["steps"] == 1000


def test_any_curve_is_searched_within_the_ladder_plus_two_and_the_best_tried_is_chosen():
    rng = __import__("numpy").random.default_rng(0)
    for _ in range(200):
        values = {}

        def curve(steps):
            if steps not in values:
                mean = float(rng.uniform(0, 1))
                values[steps] = reading(float(rng.uniform(0, 1)) * (1 - abs(2 * mean - 1)), mean)
            return values[steps]

        steps_ladder = ladder(int(rng.integers(50, 300)), int(rng.integers(300, 20000)))
        readings, order = walk(curve, steps_ladder)
        assert len(order) <= len(steps_ladder) + 2
        chosen = choose(readings, steps_ladder[-1], steps_ladder[0])["steps"]
        assert readings[chosen]["mixed"] == max(r["mixed"] for r in readings.values())
        assert chosen == min(s for s, r in readings.items() if r["mixed"] == readings[chosen]["mixed"])


def test_a_ladder_that_never_reaches_the_floor_says_which_way_to_go():
    fails = {s: reading(0.05, 0.02, all_fail=0.95) for s in ladder(250, 1000)}
    verdict = choose(fails, 1000, 250)
    assert not verdict["reached"] and "--max-steps (now 1000)" in verdict["advice"]
    succeeds = {s: reading(0.10, 0.95, all_fail=0.0) for s in ladder(250, 1000)}
    verdict = choose(succeeds, 1000, 250)
    assert not verdict["reached"] and "--min-steps (now 250)" in verdict["advice"]
    rising = {250: reading(0.2, 0.1), 500: reading(0.4, 0.3)}
    verdict = choose(rising, 500, 250)
    assert verdict["reached"] and verdict["steps"] == 500 and "still rising" in verdict["advice"]
    assert MIXED_FLOOR == 0.25


def test_the_table_marks_the_choice_and_states_the_verdict():
    candidates = {"250": {**reading(0.2, 0.1), "build_seconds": 3.0},
                  "500": {**reading(0.5, 0.4), "build_seconds": 6.0}}
    result = {"candidates": candidates, "steps": 500, "reached": True, "floor": 0.25, "advice": "", "n": 8,
              "num_prompts": 16, "seed": 0, "p_noise_turn": 0.1, "seconds": 12.0}
    text = to_markdown(result)
    assert "| 500 (chosen) | " in text and "| 250 | " in text
    assert "Chosen: sft_steps = 500, 50% of training questions mixed (at least the 25% floor)." in text


def test_bad_search_sizes_fail_before_any_build(tmp_path):
    from tracerl.policy.embedded_config import EmbeddedConfig

    with pytest.raises(ValueError, match="--samples >= 2"):
        search(EmbeddedConfig(), cache_dir=tmp_path, n=1)
    with pytest.raises(ValueError, match="--min-steps"):
        search(EmbeddedConfig(), cache_dir=tmp_path, min_steps=0)
    assert not any(tmp_path.iterdir()), "a bad size built something"


def test_a_real_search_over_tiny_inventory_builds(tmp_path, capsys):
    """Three tiny builds (10, 20, 40 steps) of the inventory example, each sampled on the same training questions;
    the chosen one is a cached build that `tracerl train` with its sft_steps loads."""
    data = tmp_path / "data"
    subprocess.run([sys.executable, str(EXAMPLE / "make_data.py"), "--num-train", "40", "--num-test", "4",
                    "--out", str(data)], check=True, capture_output=True)
    tiny = {"num_train_rows": 40, "p_noise_turn": 0.25, "batch_size": 4, "vocab_size": 400, "hidden_size": 32,
            "num_layers": 1, "max_turns": 4, "max_tokens_per_turn": 40, "max_tokens_per_rollout": 300,
            "num_eval_prompts": 2, "eval_samples_per_prompt": 1, "lr": 1e-2}
    sets = [f"data.task={EXAMPLE / 'task.py'}:make_task", f"data.train_files={json.dumps([str(data / 'train.jsonl')])}",
            f"data.test_files={json.dumps([str(data / 'test.jsonl')])}", f"policy.embedded={json.dumps(tiny)}",
            f"policy.cache_dir={tmp_path / 'cache'}", "run.num_threads=1"]
    out = tmp_path / "search"
    code = main(["warmstart", "--config", str(EXAMPLE / "config.toml"), "--search", "--min-steps", "10",
                 "--max-steps", "40", "--prompts", "4", "--out", str(out)] + [a for s in sets for a in ("--set", s)])
    result = json.loads(out.with_suffix(".json").read_text())
    assert code == (0 if result["reached"] else 1)
    tried = sorted(int(s) for s in result["candidates"])
    assert tried[:2] == [10, 20] and 10 <= min(tried) <= max(tried) <= 40 and len(tried) <= 5, tried
    for steps, r in result["candidates"].items():
        assert Path(r["path"]).is_dir() and len(r["histogram"]) == 9 and sum(r["histogram"]) == 4  # n = 8
        assert json.loads((Path(r["path"]) / "embedded_config.json").read_text())["sft_steps"] == int(steps)
    assert "(chosen)" in out.with_suffix(".md").read_text()
    assert f"--set policy.embedded.sft_steps={result['steps']}" in capsys.readouterr().out
