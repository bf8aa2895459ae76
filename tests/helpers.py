"""Shared test glue: a scripted engine that plays a domain's expert through the chat template; a FastAPI app served
on loopback in a thread."""

import json
import os
import pathlib
import socket
import threading
import time
from contextlib import contextmanager

import numpy as np

from tracerl.core.advantages import TreeAdvantages

from tracerl.io.rollout.chat import ChatRenderer
from tracerl.io.rollout.scripted_engine import ScriptedEngine
from tracerl.io.rollout.tokenizer import train_tokenizer


def _build_seed() -> int:
    text = os.environ.get("TRACERL_TEST_BUILD_SEED", "0")
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"TRACERL_TEST_BUILD_SEED={text!r} must be a non-negative integer, e.g. 1")
    return int(text)


# The build seed of every policy the tests build or initialise (`TRACERL_TEST_BUILD_SEED`, default 0). A build is
# bit-identical across thread counts on one machine, not across CPUs: another CPU's float rounding trains other weights,
# and another seed gives other weights in the same way. `.ci/run` runs the suites that use these policies under a
# second seed, so a test that holds only for the weights one machine happens to build fails there first.
BUILD_SEED = _build_seed()

# The tests' tiny embedded policy: 2-hop questions over a 40-entity world, a 64-wide model, short turns; every
# question answerable and the warm start on the RL questions, so a step has contrast and an update moves the policy
TINY_POLICY = {"seed": BUILD_SEED, "num_entities": 40, "num_distractors": 0, "hops": [2, 2], "num_train_rows": 150,
               "sft_steps": 300, "vocab_size": 500, "hidden_size": 64, "max_turns": 4, "max_tokens_per_turn": 40,
               "max_tokens_per_rollout": 400, "num_eval_prompts": 8, "eval_samples_per_prompt": 2, "lr": 1e-2,
               "unanswerable_share": 0.0, "missing_kinds": [], "warmup_fraction": 0.0}


def make_renderer(texts, vocab_size=1200):
    texts = list(texts) + ['<tool_call>{"name": "search", "arguments": {"query": "x"}}</tool_call> '
                           '<answer>x</answer>'] * 20
    return ChatRenderer(train_tokenizer(texts, vocab_size=vocab_size))


def read_turns(renderer, prefix):
    """(question, [(action, observation), ...]) from a prefix's text: the inverse of the chat template."""
    text = renderer.decode(prefix)
    question = text.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
    turns = []
    for part in text.split("<|im_start|>assistant\n")[1:-1]:
        action, rest = part.split("<|im_end|>", 1)
        if "<tool_response>\n" in rest:
            observation = rest.split("<tool_response>\n", 1)[1].rsplit("\n</tool_response>", 1)[0]
        else:  # the environment spoke as the user (BFCL's next user turn)
            observation = rest.split("<|im_start|>user\n", 1)[1].rsplit("<|im_end|>", 1)[0]
        turns.append((action, observation))
    return question, turns


def expert_engine(renderer, rows, domain, noise=0.0, wrong="<answer>nobody</answer>"):
    by_question = {r["prompt"][-1]["content"]: r for r in rows}

    def script(prefix, sample_index, rng):
        question, turns = read_turns(renderer, prefix)
        if rng.random() < noise:
            text = wrong(rng) if callable(wrong) else wrong
        else:
            text = domain.expert_turn(by_question[question], turns, np.random.default_rng(0))
        return renderer.encode(text) + [renderer.stop_token_ids[0]]
    return ScriptedEngine(script)


def random_advantages(tree, seed: int) -> TreeAdvantages:
    """Independent N(0, 1) advantages per (leaf, segment): shared segments get different values in each rollout."""
    rng = np.random.default_rng(seed)
    leaves = tuple(tree.leaves())
    paths = tuple(tuple(tree.path(leaf)[1:]) for leaf in leaves)
    return TreeAdvantages(tree.prompt_id, leaves, paths, tuple(rng.normal(size=len(p)) for p in paths))


# a small embedded multi-hop policy that builds in under a second: the trainer tests' policy
SMALL_EMBEDDED = {"seed": BUILD_SEED, "num_entities": 40, "num_distractors": 0, "hops": [2, 2], "num_train_rows": 48,
                  "vocab_size": 400, "hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1,
                  "sft_steps": 30, "batch_size": 4, "lr": 1e-2, "num_eval_prompts": 4, "eval_samples_per_prompt": 2,
                  "max_turns": 3,
                  "max_tokens_per_turn": 24, "max_tokens_per_rollout": 200}


def small_trainer_overrides(cache_dir, *more: str) -> list[str]:
    """--set overrides for a trainer on SMALL_EMBEDDED (built in `cache_dir`): grpo, 2 prompts x 2 rollouts a step,
    a KL term and a large learning rate, so that a step moves the weights; `more` is appended."""
    return [f"policy.embedded={json.dumps(SMALL_EMBEDDED)}", f"policy.cache_dir={cache_dir}",
            "data.num_train_prompts=40", "allocation.num_prompts=2", "allocation.rollouts_per_prompt=2",
            "allocation.m_max=4", "run.eval_prompts=2", "run.eval_samples=1", "run.num_threads=1",
            "run.progress=false", "run.tensorboard=false", "run.save_trees=false", "method=grpo",
            "optim.kl_coef=0.05", "optim.lr=0.05", *more]


def trainer_for(config, say=None):
    """A `Trainer` of `config` on its policy, built (or loaded from the cache) first, as `tracerl train` does."""
    from tracerl.train.policy import load_policy
    from tracerl.train.trainer import Trainer

    return Trainer(config, load_policy(config), say=say)


def trees_random_advantages(method, trees, config) -> list[TreeAdvantages]:
    """A stand-in for `compute_advantages` in a step: non-zero advantages whatever the rewards (a small policy rarely
    succeeds), fixed by each tree's prompt."""
    return [random_advantages(t, seed=sum(map(ord, str(t.prompt_id)))) for t in trees]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def thread_server(app, config=None):
    """Serve a FastAPI app with uvicorn in a daemon thread; yields the base URL. `config(app, port)` builds the
    uvicorn config (default: a plain one on 127.0.0.1)."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(config(app, port) if config else
                            uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120  # a hang-stopper generous for a loaded machine, not a bound
    while not server.started:
        assert thread.is_alive(), "uvicorn stopped before it started"
        assert time.monotonic() < deadline, "timeout: uvicorn did not start within 120 s"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(10)


def load_study_script(name: str):
    """A script of studies/ (which is not a package) as a module, registered in sys.modules under its name so
    that its dataclasses resolve."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "studies" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def play_episode(domain, row, policy, max_turns: int):
    """Run `policy(row, turns)` in a fresh env of `domain` until the episode is done or `max_turns` actions; returns
    (the last StepResult, [(action, observation), ...], env)."""
    env = domain.make_env()
    env.reset(row)
    turns = []
    for _ in range(max_turns):
        action = policy(row, turns)
        result = env.step(action)
        turns.append((action, result.observation))
        if result.done:
            break
    return result, turns, env


def finishes(fn, within: float = 120):
    """fn() run in a daemon thread: its result (or what it raised), or a test failure if it has not returned within
    `within` s (a hang-stopper generous for a loaded machine, not a bound)."""
    import pytest

    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as err:  # handed to the test below
            box["error"] = err
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(within)
    if worker.is_alive():
        pytest.fail(f"timeout: the call never returned ({within} s)")
    if "error" in box:
        raise box["error"]
    return box["value"]


def gone(pid: int, within: float = 120) -> bool:
    """True once process `pid` has exited within `within` s (a zombie counts as gone: nothing of it runs)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:
            if pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except (FileNotFoundError, IndexError):
            return True
        time.sleep(0.05)
    return False


def process_alive(pid: int) -> bool:
    """Whether process `pid` runs (Linux: from /proc; a zombie, ended but not yet reaped, counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False
