"""A few real training steps per method on the tiny policy; checkpoints; resume after SIGKILL."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from helpers import trainer_for
from tracerl.core.tree import Tree
from tracerl.io.files.runlog import read_metrics, read_rollouts, read_trees
from tracerl.train.config import load_config
from tracerl.train.trainer import run_training


def _config(overrides, tmp_path, *more):
    return load_config(None, [*overrides, f"run.out_dir={tmp_path / 'run'}", *more])


@pytest.mark.parametrize("method", ["grpo", "pcl", "treepo", "trace"])
def test_steps_of_every_method_train_and_log(tiny_overrides, tmp_path, method):
    config = _config(tiny_overrides, tmp_path, f"method={method}", "run.num_steps=2")
    trainer = trainer_for(config)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    rows = [trainer.train_step() for _ in range(config.run.num_steps)]
    assert all(row["rollout/units"] <= config.allocation.budget for row in rows)
    trained = sum(row["train/num_trained_trees"] for row in rows)
    for row in rows:
        for key in ("alloc/effective_ratio", "alloc/mixed_trees_per_budget", "alloc/nonzero_adv_token_frac",
                    "alloc/overhead_frac", "rollout/success_rate", "train/grad_norm"):
            assert key in row and np.isfinite(row[key]), (key, row)
        if row["train/num_trained_trees"]:
            assert np.isfinite(row["train/pg_loss"]) and row["train/grad_norm"] > 0
    if method in ("pcl", "trace"):
        assert "predictor/ece" in rows[0] and "predictor/loss" in rows[0]
    if method in ("treepo", "trace"):
        assert sum(row["alloc/num_prefix_anchors"] for row in rows) > 0
    changed = any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
    assert changed == (trained > 0), f"{trained} trees had a non-zero advantage, parameters changed: {changed}"
    assert [r["step"] for r in read_metrics(config.out_dir())] == [1, 2]


def test_a_mixed_step_changes_the_policy(tiny_overrides, tmp_path, capsys):
    # a whole run must see at least one mixed tree on this policy (~30% success), or nothing above was trained
    config = _config(tiny_overrides, tmp_path, "method=trace", "run.num_steps=3", "run.eval_prompts=2",
                     "run.eval_samples=1")
    result = run_training(config)
    rows = [r for r in read_metrics(config.out_dir()) if r["kind"] == "train"]
    assert sum(r["train/num_trained_trees"] for r in rows) > 0
    assert result["steps"] == 3 and result["cum_units"] == sum(r["rollout/units"] for r in rows)
    saved = json.loads((config.out_dir() / "config.json").read_text())
    assert load_config(config.out_dir() / "config.json") == config and saved["method"] == "trace"
    assert (config.out_dir() / "checkpoints" / "latest").read_text().strip() == "step-000003"
    assert list((config.out_dir() / "tensorboard").iterdir()), "TensorBoard events are written"
    saved = read_trees(config.out_dir())
    assert saved["step"] == 3 and len(saved["pool"]) == config.allocation.pool_size
    assert sum(p["granted"] > 0 for p in saved["pool"]) == len(saved["trees"]) == rows[-1]["alloc/num_prompts"]
    assert sum(len(Tree.from_dict(t).leaves()) for t in saved["trees"]) == rows[-1]["rollout/num_rollouts"]
    from tracerl.report.stage2 import read_run as read_stage2

    records = read_rollouts(config.out_dir())  # every step's rollouts, the stage-2 tables' record without the trees
    assert sorted(records) == [1, 2, 3]
    assert len(records[3]["grant"]) == rows[-1]["rollout/num_rollouts"]
    from_trees = read_stage2(config.out_dir())["rollouts"]
    for step in (1, 2):
        (config.out_dir() / "trees" / f"step-{step:06d}.json.gz").unlink()
    assert read_stage2(config.out_dir())["rollouts"] == from_trees, "the records give what the trees gave"
    # the report's budget split is the step ledger's, as logged, and it matches what the saved trees were granted
    from tracerl.report.run_report import read_run

    split = {b["step"]: b for b in read_run(config.out_dir())["budget"]}
    assert sorted(split) == [1, 2, 3]
    for r in rows:
        b = split[r["step"]]
        assert (b["root_units"], b["prefix_units"]) == (r["alloc/units_root"], r.get("alloc/units_prefix", 0.0))
        assert b["root_units"] + b["prefix_units"] == pytest.approx(r["rollout/units"])
    last = [Tree.from_dict(t) for t in saved["trees"]]
    assert split[3]["root_units"] == sum(t.root.num_granted for t in last)
    assert split[3]["num_continuations"] == sum(n.num_granted for t in last for n in t.nodes[1:])

    from tracerl.cli import main

    logged = (config.out_dir() / "metrics.jsonl").read_text()
    assert main(["eval", "--config", str(config.out_dir() / "config.json"), "--checkpoint"]) == 0
    assert f"held-out success at step 3: {result['after']['eval/success']:.1%}" in capsys.readouterr().out
    assert (config.out_dir() / "metrics.jsonl").read_text() == logged, "tracerl eval leaves the run's log alone"


def _comparable(rows):
    """Metrics that must not depend on the kill: everything but wall-clock times."""
    drop = ("sys/", "eval/seconds", "alloc/overhead_frac")
    return [{k: v for k, v in row.items() if not k.startswith(drop)} for row in rows]


def _train_cli(run_dir, overrides, *extra):
    args = [sys.executable, "-m", "tracerl.cli", "train", "--out", str(run_dir), *extra]
    for o in overrides:
        args += ["--set", o]
    return args


def test_resume_after_sigkill_gives_the_same_metrics(tiny_overrides, tmp_path):
    overrides = [*tiny_overrides, "method=trace", "run.num_steps=4", "run.eval_every=2", "run.tensorboard=false"]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    straight = tmp_path / "straight"
    subprocess.run(_train_cli(straight, overrides), check=True, env=env, capture_output=True, timeout=600)

    killed = tmp_path / "killed"
    proc = subprocess.Popen(_train_cli(killed, overrides), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    latest = killed / "checkpoints" / "latest"
    deadline = time.monotonic() + 600
    while not (latest.exists() and latest.read_text().strip() >= "step-000002"):
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline, "timeout: no checkpoint of step 2 after 600 s"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    rows_at_kill = read_metrics(killed)
    assert max(r["step"] for r in rows_at_kill) < 4, "killed too late to test anything"
    subprocess.run(_train_cli(killed, overrides, "--resume"), check=True, env=env, capture_output=True, timeout=600)

    expected, got = read_metrics(straight), read_metrics(killed)
    assert [(r["step"], r["kind"]) for r in got] == [(r["step"], r["kind"]) for r in expected]
    assert _comparable(got) == _comparable(expected)
    final = [torch.load(d / "checkpoints" / "step-000004" / "model.pt", weights_only=True) for d in (straight, killed)]
    assert all(torch.equal(final[0][k], final[1][k]) for k in final[0])


def test_the_trainer_takes_a_built_policy_and_builds_nothing(tiny_overrides, tmp_path, monkeypatch):
    """Building the policy is the caller's step (`load_policy`); the trainer trains the model it is given, and its KL
    reference is a frozen copy of those weights, not a second build or load."""
    import tracerl.policy.embedded as embedded
    from tracerl.train.policy import load_policy
    from tracerl.train.trainer import Trainer

    config = _config(tiny_overrides, tmp_path, "optim.kl_coef=0.05")
    policy = load_policy(config)

    def refused(*args, **kwargs):
        raise AssertionError("the trainer built or loaded a policy of its own")

    monkeypatch.setattr(embedded, "build_embedded", refused)
    monkeypatch.setattr(embedded, "load_embedded", refused)
    trainer = Trainer(config, policy)
    assert trainer.model is policy.model and trainer.ref_model is not None
    ref = dict(trainer.ref_model.named_parameters())
    assert all(torch.equal(p, ref[n]) and p.data_ptr() != ref[n].data_ptr() and not ref[n].requires_grad
               for n, p in trainer.model.named_parameters()), "the reference is not a frozen copy of the weights given"
    trainer.close()


def test_every_step_samples_from_an_empty_kv_store(tiny_overrides, tmp_path):
    """What a resumed step starts from, so a step kept whole and a step after a resume compute alike: a step whose
    update left the weights unchanged would otherwise hand its store to the next one."""
    trainer = trainer_for(_config(tiny_overrides, tmp_path, "method=trace"))
    seen, generate = [], trainer.engine.generate

    def recording(*args, **kwargs):
        seen.append((trainer.step, len(trainer.engine.store)))
        return generate(*args, **kwargs)

    trainer.engine.generate = recording
    for _ in range(3):
        trainer.train_step()
    firsts = {step: entries for step, entries in reversed(seen)}  # each step's first call
    assert sorted(firsts) == [0, 1, 2] and set(firsts.values()) == {0}, seen
    assert any(entries > 0 for _, entries in seen), "the store is used within a step"


def test_micro_batches_and_packing_do_not_change_the_gradient(tiny_overrides, tmp_path):
    from dataclasses import replace

    config = _config(tiny_overrides, tmp_path, "method=trace", "optim.grad_clip=0")
    trainer = trainer_for(config)
    update = trainer.update_policy
    captured = {}
    trainer.update_policy = lambda trees, advantages: captured.update(trees=trees, advantages=advantages) or {}
    trainer.train_step()
    trees, advantages = captured["trees"], captured["advantages"]
    assert sum(len(a.leaf_ids) for a in advantages) > 3, "the step must have more rollouts than a micro-batch"
    start = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    deltas = []
    for options in ({"micro_batch_rollouts": 10_000}, {"micro_batch_rollouts": 3}, {"packed": True},
                    {"packed": True, "micro_batch_rollouts": 3}):
        trainer.model.load_state_dict(start)
        trainer.optimizer = torch.optim.SGD(trainer.model.parameters(), lr=1.0)  # delta = -gradient
        trainer.config = replace(config, optim=replace(config.optim, **options))
        metrics = update(trees, advantages)
        deltas.append({k: v - start[k] for k, v in trainer.model.state_dict().items()})
    assert metrics["train/num_trained_trees"] > 0, "no tree had contrast: nothing to compare"
    scale = max(d.abs().max().item() for d in deltas[0].values())
    assert scale > 0
    for other in deltas[1:]:
        for key, want in deltas[0].items():
            torch.testing.assert_close(other[key], want, rtol=1e-4, atol=1e-5 * scale, msg=key)


def test_coupled_evaluation_reaches_the_engine_and_is_repeatable(tiny_overrides, tmp_path):
    """run.eval_coupled: the trainer's evaluation samples from per-question streams (other draws than the default's),
    and evaluating the same weights twice gives the same per-question results."""
    plain = trainer_for(_config(tiny_overrides, tmp_path, "run.eval_prompts=8", "run.eval_samples=4"))
    plain = plain.evaluate(log=False)
    coupled = trainer_for(_config(tiny_overrides, tmp_path / "c", "run.eval_prompts=8", "run.eval_samples=4",
                              "run.eval_coupled=true"))
    first, again = coupled.evaluate(log=False), coupled.evaluate(log=False)
    assert first["eval/per_prompt"] == again["eval/per_prompt"]
    assert first["eval/sampled_tokens"] != plain["eval/sampled_tokens"], "the flag did not change the draws"


def test_evaluations_run_where_eval_steps_and_eval_every_put_them(tiny_overrides, tmp_path):
    """run.eval_steps adds evaluations after the steps it names (where a comparison reads), beside eval_every's,
    the one before the first step and the one after the last."""
    config = _config(tiny_overrides, tmp_path, "method=grpo", "run.num_steps=5", "run.eval_every=4",
                     "run.eval_steps=[1,2]", "run.eval_prompts=2", "run.eval_samples=1", "run.tensorboard=false")
    run_training(config)
    assert [r["step"] for r in read_metrics(config.out_dir()) if r["kind"] == "eval"] == [0, 1, 2, 4, 5]


def test_a_token_budget_ends_the_run_at_the_step_that_reaches_it_and_a_resume_may_raise_it(tiny_overrides, tmp_path):
    """run.total_token_budget: every method of a comparison gets the same sampled tokens, however many steps."""
    from tracerl.report.compare import complete_seeds

    probe = run_training(_config(tiny_overrides, tmp_path / "probe", "run.num_steps=1", "run.tensorboard=false"))
    per_step = probe["cum_tokens"]  # about what one step samples
    budget = int(1.5 * per_step)  # reached during the second or third step, well before the cap
    more = ["method=grpo", "run.num_steps=50", "run.eval_every=1", "run.tensorboard=false"]
    result = run_training(_config(tiny_overrides, tmp_path, *more, f"run.total_token_budget={budget}"))
    train = [r for r in read_metrics(tmp_path / "run") if r["kind"] == "train"]
    assert 2 <= result["steps"] <= 3 < 50 and train[-1]["step"] == result["steps"]
    assert train[-1]["rollout/cum_tokens"] >= budget > train[-2]["rollout/cum_tokens"]  # the first step to reach it
    evals = [r["step"] for r in read_metrics(tmp_path / "run") if r["kind"] == "eval"]
    assert evals == list(range(result["steps"] + 1))  # evaluated at the stop, once

    # a finished run folder, whatever its step count, by its saved config; resume with a higher budget continues
    (tmp_path / "grpo-seed0").symlink_to(tmp_path / "run")
    assert complete_seeds(tmp_path, ["grpo"], [0])[0] == [0]
    higher = run_training(_config(tiny_overrides, tmp_path, *more, f"run.total_token_budget={3 * budget}"), resume=True)
    assert higher["steps"] > result["steps"] and higher["cum_tokens"] >= 3 * budget
    evals = [r["step"] for r in read_metrics(tmp_path / "run") if r["kind"] == "eval"]
    assert evals == list(range(higher["steps"] + 1))


def _train_main(run, overrides, *extra):
    from tracerl.cli import main

    return main(["train", "--out", str(run), *extra, *[a for o in overrides for a in ("--set", o)]])


def _one_step_run(tmp_path):
    """A run of one step on the small policy; returns (its folder, its overrides)."""
    from helpers import small_trainer_overrides

    run = tmp_path / "run"
    same = small_trainer_overrides(tmp_path / "cache", "run.num_steps=1", "run.eval_every=1")
    assert _train_main(run, same) == 0
    return run, same


def test_a_resume_without_the_runs_config_is_refused_naming_what_differs(tmp_path, capsys):
    """With config.json gone, `--resume` with another method and learning rate must not go on as if it were the same
    run: the checkpoint's own config is compared, the keys named, the fix given."""
    run, same = _one_step_run(tmp_path)
    metrics = (run / "metrics.jsonl").read_bytes()
    (run / "config.json").unlink()
    capsys.readouterr()
    assert _train_main(run, [*same, "method=pcl", "optim.lr=0.01", "run.num_steps=2"], "--resume") == 2
    err = capsys.readouterr().err
    assert "method" in err and "optim.lr" in err and "--out" in err and "Traceback" not in err, err
    assert (run / "metrics.jsonl").read_bytes() == metrics, "a refused resume trained anyway"


def test_a_resume_with_the_runs_config_rewritten_is_refused_by_the_checkpoints_own(tmp_path, capsys):
    from tracerl.train.config import load_config

    run, same = _one_step_run(tmp_path)
    metrics = (run / "metrics.jsonl").read_bytes()
    other = [*same, "method=pcl", "optim.lr=0.01", "run.num_steps=2"]
    (run / "config.json").write_text(json.dumps(load_config(None, [*other, f"run.out_dir={run}"]).to_dict()))
    capsys.readouterr()
    assert _train_main(run, other, "--resume") == 2
    err = capsys.readouterr().err
    assert "method" in err and "optim.lr" in err and "Traceback" not in err, err
    assert (run / "metrics.jsonl").read_bytes() == metrics, "a refused resume trained anyway"


# written after reading the code: the checkpoint's own config stands in for a lost config.json, and nothing else does

def test_a_resume_without_the_runs_config_but_with_the_same_config_continues_and_restores_it(tmp_path):
    run, same = _one_step_run(tmp_path)
    saved = json.loads((run / "config.json").read_text())
    (run / "config.json").unlink()
    assert _train_main(run, [*same, "run.num_steps=2"], "--resume") == 0
    steps = [r["step"] for r in read_metrics(run) if r["kind"] == "train"]
    assert steps == [1, 2], steps
    restored = json.loads((run / "config.json").read_text())
    assert {k: v for k, v in restored.items() if k != "run"} == {k: v for k, v in saved.items() if k != "run"}


@pytest.mark.parametrize("damage", ["gone, no checkpoint", "not utf-8", "symlink", "a list"])
def test_a_resume_of_a_run_folder_whose_config_cannot_be_read_is_refused_before_training(tmp_path, damage):
    from tracerl.train.trainer import _check_run_dir

    config = load_config(None, [f"run.out_dir={tmp_path / 'run'}"])
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0, "kind": "eval"}\n')
    path = run / "config.json"
    if damage == "not utf-8":
        path.write_bytes(b'{"method": "gr\xf6po"}')
    elif damage == "symlink":
        (tmp_path / "elsewhere.json").write_text(json.dumps(config.to_dict()))
        path.symlink_to(tmp_path / "elsewhere.json")
    elif damage == "a list":
        path.write_text("[]")
    words = {"gone, no checkpoint": "neither config.json nor a checkpoint", "not utf-8": r"byte 14.*save it as UTF-8",
             "symlink": "symlink", "a list": "not a config"}[damage]
    with pytest.raises(ValueError, match=words) as caught:
        _check_run_dir(config, resume=True)
    assert "config.json" in str(caught.value) and "--out" in str(caught.value), str(caught.value)
