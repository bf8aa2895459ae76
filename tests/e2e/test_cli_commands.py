"""Every subcommand of `tracerl --help`, and the command lines README.md and docs/ show that need no GPU, vLLM,
Ray cluster or download, run here on the tests' tiny policy: each documented line with its own arguments, plus
the `--set` overrides (`tiny_overrides`) and sizes (`--steps`, `--prompts`) that make it take seconds.

Not run here, and why: `--executor ray` (tests/ray), `policy.engine=vllm` (tests/vllm, .ci/vllm),
`policy.model=Qwen/...` (a download), `--device cuda` (a GPU), `tracerl train` on the default embedded policy
(a 5-minute build; the same code path runs on the tiny one), `view --serve` (serves until Ctrl-C; `serve` below
checks a server the same way)."""

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import BUILD_SEED, TINY_POLICY, free_port
from tracerl.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]


def run(capsys, *argv):
    """`tracerl argv...` in this process: (exit status, stdout, stderr)."""
    try:
        status = main([str(a) for a in argv])
    except SystemExit as stop:  # argparse, and subcommands that stop with a message
        status = stop.code
    out, err = capsys.readouterr()
    return status, out, err


def subcommands():
    parser = build_parser()
    top = next(a for a in parser._actions if a.dest == "command")
    bench = next(a for a in top.choices["bench"]._actions if a.dest == "bench")
    return [*(["bench", name] for name in bench.choices), *([name] for name in top.choices if name != "bench")]


@pytest.mark.parametrize("words", subcommands(), ids=" ".join)
def test_every_subcommand_has_help(capsys, words):
    status, out, _ = run(capsys, *words, "--help")
    assert status == 0 and out.startswith("usage: tracerl " + " ".join(words)), out[:200]


# each subcommand -> the test below that runs it (a new subcommand fails the next test until it gets one)
COVERED = {"bench alloc": "test_bench_alloc_and_predictors", "bench predictors": "test_bench_alloc_and_predictors",
           "bench engine": "test_bench_engine_and_pack", "bench pack": "test_bench_engine_and_pack",
           "bench logits": "test_bench_engine_and_pack",
           "bench view": "test_bench_view_runs_or_says_what_to_install", "train": "test_train_resume_eval_view_report",
           "bench stage2": "test_train_resume_eval_view_report",
           "bench alignment": "test_train_resume_eval_view_report",
           "eval": "test_train_resume_eval_view_report", "view": "test_train_resume_eval_view_report",
           "report": "test_train_resume_eval_view_report", "compare": "test_compare", "verdict": "test_compare",
           "warmstart": "test_regime_and_warmstart", "regime": "test_regime_and_warmstart",
           "config": "test_config_and_methods", "methods": "test_config_and_methods",
           "serve": "test_serve_answers_on_loopback", "train (lora)": "test_train_with_lora"}


def test_every_subcommand_is_run_by_a_test():
    assert sorted(k for k in COVERED if "(" not in k) == sorted(" ".join(w) for w in subcommands())
    assert all(name in globals() for name in COVERED.values())


def test_config_and_methods(capsys):
    status, out, _ = run(capsys, "config")
    assert status == 0 and "data.task" in out and "allocation.budget" in out
    status, out, _ = run(capsys, "methods")
    assert status == 0 and all(m in out for m in ("grpo", "pcl", "treepo", "trace"))


def test_bench_alloc_and_predictors(capsys):
    # README: tracerl bench alloc; docs/predictors.md: tracerl bench predictors [--json]
    status, out, _ = run(capsys, "bench", "alloc", "--methods", "grpo,trace", "--steps", "3", "--warmup", "1")
    assert status == 0 and "| trace" in out
    status, out, _ = run(capsys, "bench", "alloc", "--methods", "grpo", "--steps", "3", "--warmup", "1",
                         "--set", "allocation.budget_unit=tokens", "--json")
    assert status == 0 and "grpo" in json.loads(out)["methods"]
    status, out, _ = run(capsys, "bench", "predictors", "--predictors", "constant,hashed_logistic", "--steps", "3",
                         "--warmup", "1", "--json")
    assert status == 0 and set(json.loads(out)["predictors"]) >= {"constant", "hashed_logistic"}


def test_bench_engine_and_pack(capsys):
    # README: tracerl bench engine, tracerl bench pack (tiny sizes through --set)
    small = ["--set", "num_prompts=2", "--set", "num_turns=2", "--set", "branch_depths=[1]",
             "--set", "hidden_size=32", "--set", "num_layers=1", "--set", "gemm_sizes=[64]",
             "--set", "sweep_rows=[1,2]", "--set", "sweep_decode_tokens=2", "--set", "eval_shape=false"]
    status, out, _ = run(capsys, "bench", "engine", "--repeats", "1", *small)
    assert status == 0 and "reuse" in out.lower() and "matmul peak" in out
    status, out, _ = run(capsys, "bench", "pack", "--hidden-size", "32", "--set", "num_prompts=2",
                         "--set", "num_layers=1")
    assert status == 0 and "pack" in out.lower()
    # benchmarks/README.md: tracerl bench logits (each variant in its own process; a small vocabulary here)
    status, out, _ = run(capsys, "bench", "logits", "--json", "--set", "vocab_size=512", "--set", "prompt_tokens=16",
                         "--set", "repeats=1")
    variants = json.loads(out)["variants"]
    assert status == 0 and variants["kept"]["logit_rows"] < variants["all"]["logit_rows"]
    assert variants["kept"]["loss_rel_diff"] < 1e-6 and variants["kept"]["grad_max_rel_diff"] < 1e-5


def test_bench_view_runs_or_says_what_to_install(capsys):
    status, out, err = run(capsys, "bench", "view", "--num-prompts", "5", "--repeats", "1")
    if shutil.which("chromedriver") or shutil.which("chromium"):
        assert status == 0, err
    else:
        assert status not in (0, None) and "tracerl bench view" in str(status) + err, (status, err)


@pytest.fixture(scope="module")
def trained(tiny_overrides, tmp_path_factory):
    """README, Training: `tracerl train --config configs/grpo.toml --set optim.lr=3e-4 --set run.num_steps=20`,
    on the tiny policy for 2 steps; the run directory the commands below read."""
    out = tmp_path_factory.mktemp("cli") / "mine"
    sets = [a for o in tiny_overrides for a in ("--set", o)]
    status = main(["train", "--config", str(ROOT / "configs" / "grpo.toml"), "--set", "optim.lr=3e-4",
                   "--set", "run.num_steps=2", "--out", str(out), *sets])
    assert status == 0
    return out, sets


def test_train_prints_the_summary_and_writes_the_run(trained):
    out, _ = trained
    assert (out / "report.md").is_file() and (out / "config.json").is_file()
    assert "No reward failures" in (out / "report.md").read_text()


def test_train_resume_eval_view_report(trained, capsys, tmp_path):
    out, sets = trained
    same = ["--config", ROOT / "configs" / "grpo.toml", "--set", "optim.lr=3e-4", *sets]  # the run's own options
    # README: tracerl train --out runs/mine --resume
    status, text, err = run(capsys, "train", "--out", out, "--resume", *same, "--set", "run.num_steps=3")
    assert status == 0, err
    assert "held-out success after" in text
    # README: tracerl eval --out runs/mine --checkpoint
    status, text, err = run(capsys, "eval", "--out", out, "--checkpoint", *same)
    assert status == 0 and "held-out success at step 3" in text, (text, err)
    # README: tracerl view runs/trace-seed0 --step 12 (without --serve)
    status, text, _ = run(capsys, "view", out, "--step", "3")
    assert status == 0 and Path(text.strip()).is_file()
    # README: tracerl report runs/trace-seed0
    status, text, _ = run(capsys, "report", out)
    assert status == 0 and Path(text.strip()).name == "report.md"
    # README: tracerl bench stage2 RUN_DIR ... (a grpo run: fresh rollouts only)
    status, text, _ = run(capsys, "bench", "stage2", out)
    assert status == 0 and "| fresh | 1 |" in text, text
    # README: tracerl bench alignment RUN_DIR ... (its JSON is kept and reused by a rerun with the same --out)
    small = ["--methods", "grpo", "--draws", "2", "--reference-prompts", "6", "--reference-samples", "4",
             "--out", tmp_path / "alignment"]
    status, text, err = run(capsys, "bench", "alignment", out, *small)
    assert status == 0 and "| grpo | 2 x 1 |" in text and (tmp_path / "alignment" / "alignment.md").is_file(), err
    status, again, err = run(capsys, "bench", "alignment", out, *small)
    assert status == 0 and again == text and "kept" in err
    status, _, _ = run(capsys, "bench", "alignment", out, *small, "--methods", "grpo,grpo[optim.lr=1e-9]")
    assert "measured grpo, not grpo,grpo[optim.lr=1e-9]" in str(status)
    status, _, err = run(capsys, "bench", "alignment", out, *small, "--methods", "grpo,trace", "--out", tmp_path / "b")
    assert status not in (0, None) and "trace steer by a predictor" in str(status) + err, (status, err)


def test_regime_and_warmstart(tiny_overrides, tmp_path, capsys):
    sets = [a for o in tiny_overrides for a in ("--set", o)]
    # README: tracerl regime [--config ...] [--set ...] (--out PATH also writes PATH.md and PATH.json)
    status, text, err = run(capsys, "regime", *sets, "--prompts", "4", "--samples", "2", "--out", tmp_path / "regime")
    assert status == 0, err
    assert "| all | 4 |" in text and (tmp_path / "regime.json").is_file() and (tmp_path / "regime.md").is_file()
    # README: tracerl warmstart (with --keep: the tiny policy is cached, so this loads it)
    status, text, err = run(capsys, "warmstart", *sets, "--keep")
    assert status == 0 and "held-out success" in text, err


@pytest.mark.slow
def test_compare(tiny_overrides, tmp_path, capsys):
    # README: tracerl compare --methods grpo,pcl,treepo,trace --seeds 5 --set run.eval_every=4
    sets = [a for o in tiny_overrides for a in ("--set", o)]
    status, text, err = run(capsys, "compare", "--methods", "grpo,trace", "--seeds", "1", "--set", "run.eval_every=4",
                            "--set", "run.num_steps=1", *sets, "--out", tmp_path / "compare")
    assert status == 0, err
    assert "trace" in text and (tmp_path / "compare" / "compare.md").is_file()
    # README: tracerl verdict runs/compare/compare.json --planned-seeds 5
    status, text, err = run(capsys, "verdict", tmp_path / "compare" / "compare.json", "--planned-seeds", "5")
    assert status == 0, err
    assert text.startswith("# Primary analysis: `trace`") and "interim look (1 of 5 planned seeds)" in text
    # docs/training.md: tracerl compare --methods grpo,pcl,trace --seeds 0-7 --status --jobs 2
    status, text, err = run(capsys, "compare", "--methods", "grpo,trace", "--seeds", "0-1", "--status", "--jobs", "2",
                            "--set", "run.num_steps=1", *sets, "--out", tmp_path / "compare")
    assert status == 0, err
    assert text.startswith("2 of 4 runs complete") and "| trace | 1 of 2 | - | 1 |" in text


@pytest.mark.slow
def test_compare_runs_the_adaptive_samplers_end_to_end(tiny_overrides, tmp_path, capsys):
    """The five samplers users switch on elsewhere, and our two round samplers, train through `tracerl compare` on
    the tiny policy: every round sampler's step spends the budget, keeps groups and logs its rounds."""
    sets = [a for o in tiny_overrides for a in ("--set", o)]
    methods = ["dapo", "reinforce_ada", "speed", "pilot_commit", "posterior", "posterior-tree", "knapsack_rl"]
    status, text, err = run(capsys, "compare", "--methods", ",".join(["grpo"] + methods), "--seeds", "1",
                            "--set", "run.num_steps=1", "--set", "run.eval_every=1", *sets, "--out", tmp_path / "cmp")
    assert status == 0, err
    assert all(f"| {m} |" in text for m in methods), text
    for m in methods[:-1]:
        metrics = tmp_path / "cmp" / f"{m}-seed0" / "metrics.jsonl"
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        train = [r for r in rows if r["kind"] == "train"]
        assert train and train[0]["alloc/rounds"] >= 1 and train[0]["alloc/rollouts_sampled"] >= 1, (m, train)


@pytest.mark.slow
def test_the_inventory_example_from_its_documented_lines(tmp_path, capsys, monkeypatch):
    """docs/tasks.md: `python examples/inventory/make_data.py` then `tracerl train --config
    examples/inventory/config.toml`, from another directory than the repository root (the config's paths are its
    folder's), on a tiny warm start."""
    example = ROOT / "examples" / "inventory"
    data = tmp_path / "data"
    subprocess.run([sys.executable, example / "make_data.py", "--num-train", "40", "--num-test", "4", "--out", data],
                   check=True, capture_output=True)
    monkeypatch.chdir(tmp_path)
    tiny = {"num_train_rows": 40, "sft_steps": 20, "vocab_size": 400, "hidden_size": 32, "num_layers": 1,
            "max_turns": 4, "max_tokens_per_turn": 40, "max_tokens_per_rollout": 300, "num_eval_prompts": 2,
            "eval_samples_per_prompt": 1}
    status, text, err = run(capsys, "train", "--config", example / "config.toml", "--out", tmp_path / "run",
                            "--set", f"data.train_files={json.dumps([str(data / 'train.jsonl')])}",
                            "--set", f"data.test_files={json.dumps([str(data / 'test.jsonl')])}",
                            "--set", f"policy.embedded={json.dumps(tiny)}", "--set", f"policy.cache_dir={tmp_path}",
                            "--set", "run.num_steps=1", "--set", "run.eval_prompts=4", "--set", "run.eval_samples=1",
                            "--set", "run.num_threads=1", "--set", "run.progress=false",
                            "--set", "allocation.num_prompts=4", "--set", "optim.micro_batch_rollouts=8")
    assert status == 0, err
    assert "held-out success after" in text


@pytest.fixture(scope="module")
def model_dir(tiny_overrides, tmp_path_factory):
    """The tiny policy saved with save_pretrained: what `policy.model=<dir>` and `serve --model <dir>` read."""
    from tracerl.policy.embedded import EmbeddedConfig, build_embedded

    cache = next(o.split("=", 1)[1] for o in tiny_overrides if o.startswith("policy.cache_dir="))
    policy = build_embedded(EmbeddedConfig.from_dict(TINY_POLICY), cache)
    path = tmp_path_factory.mktemp("cli") / "my-model"
    policy.model.save_pretrained(path)
    policy.tokenizer.save_pretrained(path)
    return path


BROKEN_TASK = """
from tracerl.io.env.task import UserTask


def search(query: str) -> str:
    \"\"\"Search the notes.

    Args:
        query: what to look for
    \"\"\"
    return "nothing found"


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"value": 1.0}  # no "score": every call fails


def expert(row, turns, rng):
    return "<answer> x</answer>"  # the warm start learns to answer at once, so every rollout calls the reward


def make_task():
    return UserTask(tools=[search], compute_score=compute_score, expert=expert, train_files=["rows.jsonl"],
                    test_files=["rows.jsonl"])
"""

# a policy warm-started on BROKEN_TASK's expert in seconds: it answers, whatever weights a machine builds
ANSWERING = {"seed": BUILD_SEED, "num_train_rows": 8, "sft_steps": 40, "batch_size": 4, "vocab_size": 300,
             "hidden_size": 32, "num_layers": 1, "max_turns": 3, "max_tokens_per_turn": 24,
             "max_tokens_per_rollout": 120, "num_eval_prompts": 4, "eval_samples_per_prompt": 1, "lr": 1e-2}


def test_a_reward_that_always_fails_is_shown_and_fails_the_command(tmp_path, capsys, monkeypatch):
    rows = [{"data_source": "notes", "prompt": [{"role": "user", "content": f"Who is person {i}'s father?"}],
             "reward_model": {"ground_truth": "x"}} for i in range(8)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "task.py").write_text(BROKEN_TASK)
    (tmp_path / "config.toml").write_text('method = "grpo"\n[data]\ntask = "task.py:make_task"\n')
    monkeypatch.chdir(tmp_path)  # the task's own files are relative to the working directory
    # the reward is called on final answers only: the policy is the one built on the task's expert, which answers (the
    # multi-hop policy answered 2 of 16 of these questions on one machine's build and none on another's)
    out = tmp_path / "run"
    sets = [f"policy.embedded={json.dumps(ANSWERING)}", f"policy.cache_dir={tmp_path / 'cache'}", "run.num_steps=1",
            "run.eval_prompts=4", "run.eval_samples=2", "run.num_threads=1", "run.progress=false",
            "allocation.num_prompts=4", "allocation.rollouts_per_prompt=2", "data.max_turns=3"]
    with pytest.warns(UserWarning, match=r"the reward function failed on \d+ of \d+ calls so far .* fix the reward"):
        status, text, err = run(capsys, "train", "--config", tmp_path / "config.toml", "--out", out,
                                *(arg for s in sets for arg in ("--set", s)))
    assert "reward failures in training" in text and "reward failures in held-out evaluation" in text, text
    assert "WARNING: most training reward calls failed" in text
    report = (out / "report.md").read_text()
    assert "reward failures in training" in report
    assert status == 1 and "every reward call" in err, (status, err)


def test_train_with_lora(tiny_overrides, tmp_path, capsys):
    # docs/training.md: tracerl train --set policy.lora_rank=16 --set policy.lora_alpha=32
    pytest.importorskip("peft")
    sets = [a for o in tiny_overrides for a in ("--set", o)]
    status, text, err = run(capsys, "train", "--set", "policy.lora_rank=16", "--set", "policy.lora_alpha=32", *sets,
                            "--set", "run.num_steps=1", "--out", tmp_path / "lora")
    assert status == 0 and "held-out success after" in text, err


def test_serve_answers_on_loopback(model_dir, tiny_overrides, tmp_path, capsys):
    """docs/engines.md: `tracerl serve --model ./my-model --port 8000 --threads 1`, the tiny policy saved with
    save_pretrained as ./my-model; then `tracerl train --set policy.engine=openai --set policy.base_url=...`
    samples through it."""
    httpx = pytest.importorskip("httpx")
    model = model_dir
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "tracerl.cli", "serve", "--model", str(model), "--port",
                               str(port), "--threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.stdout.read().decode()[-2000:]
            try:
                reply = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "tracerl serve did not answer within 120 s"
                time.sleep(0.5)
        assert reply.status_code == 200 and reply.json()["data"]
        sets = [a for o in tiny_overrides for a in ("--set", o)]
        status, text, err = run(capsys, "train", "--set", "policy.engine=openai", "--set",
                                f"policy.base_url=http://127.0.0.1:{port}", *sets, "--set", "run.num_steps=1",
                                "--out", tmp_path / "served")
        assert status == 0 and "held-out success after" in text, err
    finally:
        server.terminate()
        server.wait(30)
