"""The embedded default policy on a deliberately small config: cache, masking, SFT, evaluation via the real driver."""

import dataclasses
import fcntl
import hashlib
import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from helpers import BUILD_SEED, read_turns

from tracerl.engines.transformers_engine import TransformersEngine
from tracerl.io.files.runlog import PROVENANCE_FILE
from tracerl.io.rollout.driver import ReActDriver
from tracerl.io.rollout.engine import SamplingParams
from tracerl.io.rollout.scripted_engine import ScriptedEngine
from tracerl.policy import embedded
from tracerl.policy.embedded import (
    EmbeddedConfig,
    build_embedded,
    evaluate,
    expert_episode,
    render_episode,
    run_provenance,
    sft_loss,
    weights_hash,
    write_provenance,
)

SMALL = EmbeddedConfig(seed=BUILD_SEED, num_entities=40, num_distractors=8, hops=(2, 3), num_train_rows=48,
                       p_noise_turn=0.3, unanswerable_share=0.0,
                       vocab_size=400, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, sft_steps=30,
                       batch_size=4, lr=1e-2, num_eval_prompts=4, eval_samples_per_prompt=2)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(cache dir, policy, number of SFT runs) for one build of SMALL."""
    cache = tmp_path_factory.mktemp("cache")
    calls = []
    original = embedded.train_sft

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(embedded, "train_sft", counting)
        messages = []
        policy = build_embedded(SMALL, cache, progress=messages.append)
    assert len(calls) == 1 and any("SFT step" in m for m in messages), messages
    return cache, policy


def greedy(policy, prompt_ids, max_tokens=24):
    engine = TransformersEngine(policy.model, reuse_kv=False)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, stop_token_ids=policy.renderer.stop_token_ids)
    return [c[0] for c in engine.generate(prompt_ids, params)]


def test_build_writes_a_complete_cache_and_a_second_call_loads_it(built, monkeypatch):
    cache, policy = built
    path = cache / SMALL.key()
    assert policy.path == path
    # the build hands back the saved policy as a later call loads it, not the model trained in memory: that one has
    # the same weights and logits but not always bit-identical gradients, so a run in the building process drifted
    # (a sampled token flipped after a few steps) from the same run started afterwards
    assert Path(policy.model.name_or_path) == path / "model", "the build returned the in-memory model"
    assert {p.name for p in path.iterdir()} == {"tokenizer", "model", "embedded_config.json", "metrics.json"}
    assert not [p for p in cache.iterdir() if p.name.startswith(".")], "a temporary build folder was left behind"
    assert {p.name for p in cache.iterdir()} == {SMALL.key(), f"{SMALL.key()}.lock"}
    assert EmbeddedConfig.from_dict(json.loads((path / "embedded_config.json").read_text())) == SMALL
    metrics = json.loads((path / "metrics.json").read_text())
    for key in ("train/sft_loss_curve", "eval/success", "eval/success_se", "sys/build_seconds"):
        assert key in metrics, f"metrics.json lacks {key}"

    def no_training(*args, **kwargs):
        raise AssertionError("a cached build was trained again")

    monkeypatch.setattr(embedded, "train_sft", no_training)
    loaded = build_embedded(SMALL, cache)
    assert loaded.config == SMALL and loaded.path == path
    state, loaded_state = policy.model.state_dict(), loaded.model.state_dict()
    assert all(torch.equal(state[k], loaded_state[k]) for k in state), "the loaded weights differ from the built ones"
    rows = policy.domain.rows("test", 3, seed=5)
    tools = policy.domain.make_env().tools()
    prompts = [policy.renderer.prompt_ids(r["prompt"], tools) for r in rows]
    assert prompts == [loaded.renderer.prompt_ids(r["prompt"], tools) for r in rows], "the tokenizer changed on reload"
    for a, b in zip(greedy(policy, prompts), greedy(loaded, prompts)):
        assert a.token_ids == b.token_ids, "the loaded policy generates differently at temperature 0"


def test_rebuild_trains_again_and_replaces_the_cache(built, monkeypatch):
    cache, policy = built
    calls = []
    original = embedded.train_sft
    monkeypatch.setattr(embedded, "train_sft", lambda *a, **k: calls.append(1) or original(*a, **k))
    again = build_embedded(SMALL, cache, rebuild=True)
    assert calls == [1], "rebuild=True did not retrain"
    assert again.path == policy.path and (again.path / "metrics.json").exists()
    assert sorted(p.name for p in cache.iterdir()) == [SMALL.key(), f"{SMALL.key()}.lock"], \
        "rebuild left other folders in the cache"


def test_a_second_process_waits_for_the_build_and_loads_it(built, tmp_path, monkeypatch):
    """`tracerl compare --jobs 2` starts two runs of one build at once: the second waits on the first's lock and
    loads what it saved instead of training the same weights again."""
    cache, _ = built
    fresh = tmp_path / "cache"
    fresh.mkdir()
    path = fresh / SMALL.key()
    holder = open(fresh / f"{SMALL.key()}.lock", "a")  # another process's build: flock is per open file
    fcntl.flock(holder, fcntl.LOCK_EX)
    monkeypatch.setattr(embedded, "train_sft", lambda *a, **k: pytest.fail("the waiting process trained again"))
    messages, result = [], []
    waiter = threading.Thread(target=lambda: result.append(build_embedded(SMALL, fresh, progress=messages.append)))
    waiter.start()
    waiter.join(timeout=1.0)
    assert waiter.is_alive(), "build_embedded did not wait for the lock"
    shutil.copytree(cache / SMALL.key(), path)  # what the other process saved
    fcntl.flock(holder, fcntl.LOCK_UN)
    holder.close()
    waiter.join(timeout=120)
    assert not waiter.is_alive() and result and result[0].path == path
    assert any("waiting for another process" in m for m in messages), messages
    assert any("built meanwhile by another process" in m for m in messages), messages


def test_sft_loss_decreases(built):
    curve = json.loads((built[0] / SMALL.key() / "metrics.json").read_text())["train/sft_loss_curve"]
    assert curve[-1] < 0.7 * curve[0], f"the SFT loss did not fall: {curve}"


def test_traces_are_laid_out_exactly_as_the_driver_lays_out_rollouts(built):
    """Replay noisy expert episodes through the real driver: same token ids, and mask 0 exactly on inserted text."""
    policy = built[1]
    renderer, domain = policy.renderer, policy.domain
    rows = domain.rows("train", 6, seed=3)
    rng = np.random.default_rng(0)
    episodes = [expert_episode(domain, row, rng, p_noise_turn=0.3, max_turns=SMALL.max_turns) for row in rows]
    assert any(e.num_noisy_turns for e in episodes), "the test should cover noisy turns"
    actions = {e.row["prompt"][-1]["content"]: [a for a, _, _ in e.turns] for e in episodes}

    def replay(prefix, sample_index, rng):
        question, turns = read_turns(renderer, prefix)
        return renderer.encode(actions[question][len(turns)]) + [renderer.stop_token_ids[0]]

    driver = ReActDriver(ScriptedEngine(replay), renderer, domain, limits=SMALL.limits())
    driver.set_rows(rows)
    trees, _ = driver.run_roots(list(range(len(rows))), [1] * len(rows))
    tools = domain.make_env().tools()
    for episode, tree in zip(episodes, trees):
        ids, mask = render_episode(renderer, episode, tools, SMALL.limits())
        (leaf,) = tree.leaves()
        path = tree.path(leaf)
        assert ids == tree.prefix_token_ids(leaf), "token ids differ from the driver's"
        assert mask == [m for n in path for m in tree.nodes[n].segment.mask], "mask differs from the driver's"
        assert tree.nodes[leaf].reward == episode.reward
        policy_text = renderer.decode([t for t, m in zip(ids, mask) if m])
        assert policy_text == "".join(a + "<|im_end|>" for a, _, _ in episode.turns), "mask 1 off the policy's turns"
        inserted = renderer.decode([t for t, m in zip(ids, mask) if not m])
        assert all(o in inserted for _, o, _ in episode.turns if o), "an observation is not under mask 0"
        assert "<|im_start|>assistant\n" in inserted and "<tool_call>" not in inserted


def test_sft_loss_counts_policy_tokens_only(built):
    model = built[1].model
    gen = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, model.config.vocab_size, (2, 9), generator=gen)  # (B, T)
    mask = torch.tensor([[0, 0, 1, 1, 0, 0, 1, 0, 0], [0, 1, 0, 0, 0, 1, 1, 1, 0]])  # (B, T)
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=input_ids).logits, -1)  # (B, T, V)
        want = -np.mean([logp[b, t - 1, input_ids[b, t]].item() for b in range(2) for t in range(9) if mask[b, t]])
        got = sft_loss(model, input_ids, mask).item()
        last = input_ids.clone()  # the last token is a target under mask 0 and context for nothing
        last[:, -1] = (last[:, -1] + 1) % model.config.vocab_size
        unchanged = sft_loss(model, last, mask).item()
        policy = input_ids.clone()  # a policy token's target does enter the loss
        policy[0, 3] = (policy[0, 3] + 1) % model.config.vocab_size
        changed = sft_loss(model, policy, mask).item()
    assert got == pytest.approx(want, rel=1e-5)
    assert unchanged == pytest.approx(got, rel=1e-6), "a token under mask 0 was a target of the loss"
    assert changed != pytest.approx(got, rel=1e-6)


def test_evaluate_runs_the_real_driver_and_returns_sane_numbers(built):
    policy = built[1]
    result = evaluate(policy, "test", num_prompts=3, samples_per_prompt=2, temperature=1.0, seed=0)
    assert result["eval/num_prompts"] == 3 and result["eval/num_rollouts"] == 6
    assert 0.0 <= result["eval/success"] <= 1.0 and result["eval/success_se"] >= 0.0
    assert result["eval/sampled_tokens"] > 0 and result["eval/total_tokens"] > result["eval/sampled_tokens"]
    assert result == {**evaluate(policy, "test", 3, 2, temperature=1.0, seed=0), "eval/seconds": result["eval/seconds"]}


def test_a_bad_config_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="p_noise_turn"):
        EmbeddedConfig(p_noise_turn=1.0)
    with pytest.raises(ValueError, match="sft_steps"):
        EmbeddedConfig(sft_steps=0)
    assert EmbeddedConfig().key() != EmbeddedConfig(seed=1).key()


def test_the_build_records_the_hash_of_the_weights_it_saved(built):
    cache, policy = built
    metrics = json.loads((cache / SMALL.key() / "metrics.json").read_text())
    assert metrics["build/weights_sha256"] == policy.weights_hash() == weights_hash(policy.model.state_dict())
    assert metrics["build/machine"]["torch"] == torch.__version__


def test_the_weights_hash_sees_one_changed_bit_and_not_the_order_of_the_state_dict(built):
    state = built[1].model.state_dict()
    reordered = dict(reversed(list(state.items())))
    assert weights_hash(reordered) == weights_hash(state)
    changed = {k: v.clone() for k, v in state.items()}
    name = sorted(changed)[-1]
    flat = changed[name].view(-1)
    flat[0] = torch.nextafter(flat[0], torch.tensor(float("inf")))  # one ulp
    assert weights_hash(changed) != weights_hash(state), f"a one-ulp change of {name} kept the hash"
    renamed = {("x." + k if k == name else k): v for k, v in state.items()}
    assert weights_hash(renamed) != weights_hash(state)


def test_a_build_gives_the_same_weights_whatever_the_callers_thread_count(built, tmp_path, monkeypatch):
    """The cached build was made under 1 thread (this module's fixture); building the same config under 2 threads
    must give bit-identical weights, train on one thread, and hand the caller its 2 threads back."""
    seen = []
    original = embedded.train_sft
    monkeypatch.setattr(embedded, "train_sft",
                        lambda *a, **k: seen.append(torch.get_num_threads()) or original(*a, **k))
    torch.set_num_threads(2)
    try:
        again = build_embedded(SMALL, tmp_path)
        assert torch.get_num_threads() == 2, "the build did not restore the caller's thread count"
    finally:
        torch.set_num_threads(1)
    assert seen == [embedded.BUILD_THREADS]
    assert again.weights_hash() == built[1].weights_hash(), "the same config built under 2 threads has other weights"


def test_run_provenance_is_written_once_and_names_the_weights(built, tmp_path):
    policy = built[1]
    record = run_provenance(policy.model, source=str(policy.path))
    assert record["weights_sha256"] == policy.weights_hash() and record["source"] == str(policy.path)
    assert record["torch"] == torch.__version__ and record["num_cpus"] >= 1 and record["cpu"]
    assert record["code_sha256"] == embedded.source_hash() and record["tracerl"]
    path = write_provenance(tmp_path / "run", record)
    assert path == tmp_path / "run" / PROVENANCE_FILE
    write_provenance(tmp_path / "run", {**record, "weights_sha256": "other"})  # a resumed run keeps the first record
    assert json.loads(path.read_text()) == record


def test_a_run_resumed_under_other_code_adds_that_codes_hash_once(tmp_path):
    run = tmp_path / "run"
    embedded.note_resumed_code(run)
    assert not run.exists()  # no record: nothing is written
    path = write_provenance(run, {"weights_sha256": "w" * 64, "code_sha256": embedded.source_hash()})
    embedded.note_resumed_code(run)
    assert "code_sha256_resumed" not in json.loads(path.read_text())  # resumed under the code it started with
    path.write_text(json.dumps({"weights_sha256": "w" * 64, "code_sha256": "old" * 21}))
    for _ in range(2):
        embedded.note_resumed_code(run)
    assert json.loads(path.read_text())["code_sha256_resumed"] == [embedded.source_hash()]


def test_the_source_hash_names_the_code_not_where_it_lies(tmp_path):
    installed = Path(embedded.__file__).resolve().parent.parent
    copy = tmp_path / "copy" / "tracerl"
    shutil.copytree(installed, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert embedded.source_hash(copy) == embedded.source_hash()
    (copy / "core" / "__pycache__").mkdir(exist_ok=True)
    (copy / "core" / "__pycache__" / "samplers.cpython-311.pyc").write_bytes(b"compiled")
    assert embedded.source_hash(copy) == embedded.source_hash()  # compiled files are not the code
    edited = tmp_path / "edited" / "tracerl"
    shutil.copytree(copy, edited)
    module = edited / "core" / "samplers.py"
    module.write_text(module.read_text().replace("budget", "budgeT", 1))
    assert embedded.source_hash(edited) != embedded.source_hash()
    moved = tmp_path / "moved" / "tracerl"
    shutil.copytree(copy, moved)
    (moved / "core" / "samplers.py").rename(moved / "core" / "samplers2.py")
    assert embedded.source_hash(moved) != embedded.source_hash()


def test_a_field_added_later_keeps_the_names_of_builds_made_before_it():
    data = EmbeddedConfig().to_dict()
    for name in embedded.KEYLESS_DEFAULTS:  # what to_dict wrote before those fields existed
        del data[name]
    before = hashlib.sha256(json.dumps({"version": embedded.BUILD_VERSION, **data}, sort_keys=True).encode())
    assert EmbeddedConfig().key() == before.hexdigest()[:16]
    assert EmbeddedConfig().key() == "b18ae386deb0feb1", "the default build's recorded name changed"
    for later in (EmbeddedConfig(split_digits=True), EmbeddedConfig(warmup_options={"templates": {"balance": 1.0}})):
        assert later.key() != EmbeddedConfig().key()
    changed = EmbeddedConfig(warmup_hop_mix=(1, 1, 1, 0.4, 0.05))
    assert changed.key() != EmbeddedConfig().key()
    assert EmbeddedConfig.from_dict(changed.to_dict()) == changed
    assert changed.make_domain().warmup_hop_mix == (1, 1, 1, 0.4, 0.05)


def test_the_build_portability_script_reports_the_build_it_made(built, tmp_path, monkeypatch):
    """benchmarks/gpu/build_portability.py: its `small` preset is this module's SMALL, the hash it reports is the
    build's, and --build-threads N trains on N threads (the override that shows whether a machine's weights depend on
    the thread count)."""
    sys_path = str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu")
    monkeypatch.syspath_prepend(sys_path)
    import build_portability

    # the script's preset is the tests' SMALL at build seed 0; it runs here on the file of SMALL as built (any seed)
    assert EmbeddedConfig.from_dict(build_portability.SMALL) == dataclasses.replace(SMALL, seed=0), \
        "the script's `small` is not the tests' SMALL"
    config_file = tmp_path / "small.json"
    config_file.write_text(json.dumps(SMALL.to_dict()))
    monkeypatch.setattr(embedded, "BUILD_THREADS", embedded.BUILD_THREADS)  # restored after the override below
    seen = []
    original = embedded.train_sft
    monkeypatch.setattr(embedded, "train_sft",
                        lambda *a, **k: seen.append(torch.get_num_threads()) or original(*a, **k))
    results = []
    for threads in (0, 2):
        out = tmp_path / f"small-{threads}.json"
        monkeypatch.setattr("sys.argv", ["build_portability.py", "--config", str(config_file), "--build-threads",
                                         str(threads), "--out", str(out)])
        build_portability.main()
        results.append(json.loads(out.read_text()))
    assert seen == [1, 2] and [r["build_threads"] for r in results] == [1, 2]
    assert results[0]["weights_sha256"] == built[1].weights_hash() and results[0]["key"] == SMALL.key()
    assert results[0]["torch"] == torch.__version__ and results[0]["cpu"]
