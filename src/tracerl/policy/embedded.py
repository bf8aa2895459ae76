"""The embedded default policy: a tiny Qwen3 warm-started on multi-hop QA, built on the spot, cached on disk.

`build_embedded(config, cache_dir)` makes everything `tracerl train` needs without a download:
1. the task: a generated multi-hop QA world (`MultiHopDomain`) with 1-5 hop questions in equal shares, look-alike
   distractor entities, a BM25 search tool that returns the best document, no documents for universities (a
   quarter of the questions need one and cannot be answered) and a 5-turn cap (4 hops have no slack, 5 cannot
   finish); the warm start's questions are a split of their own, apart from RL's and the test's;
2. expert traces: the domain's scripted expert, where each turn is replaced with probability `p_noise_turn` by a
   plausible wrong action (a search for a look-alike name, or an early answer);
3. a byte-level BPE tokenizer trained on the task text (documents, questions, expert turns);
4. a random-init tiny Qwen3, trained by supervised fine-tuning on the traces rendered exactly as the rollout driver
   renders them (same `ChatRenderer`); the loss covers policy tokens only (assistant turns, mask 1), never the
   prompt or the tool responses (mask 0);
5. a held-out evaluation on the test split (`CHECK_SPLIT`), through the real `ReActDriver` + `TransformersEngine`
   (`evaluate`).
Another domain with a scripted expert (`build_embedded(..., domain=...)`: `MathDomain`, `FuncallDomain`, or a user's
task, `UserTaskDomain`, docs/tasks.md) replaces steps 1-2's world and expert with the domain's training rows and
expert, and a noisy turn is then the expert's turn for another row at the same point (another question's program,
another task's call: plausible and wrong). A built-in domain's warm start draws its rows with `warmup_seed(seed)`,
a stream apart from RL's (seeded by the run seed) although short questions can recur; a user's task warms up on its
own training rows. `EmbeddedConfig.split_digits` gives every digit its own token; with 4 layers it is what made
copying numbers learnable at this size, and neither alone did (docs/domains.md measures it).
Everything lands in `cache_dir/<hash of the config>/`, written to a temporary folder and renamed into place, so
a half-written build is never loaded; later calls load it, and so does the building call before it returns (the
model left in memory by training has the same logits but not bit-identical gradients).

Why this task: an allocator needs prompts that differ, for reasons the prompt and the transcript show. With little
imitation noise (2%) failures are systematic rather than per-turn coin flips: the default build's starting policy,
sampled 8 times on 256 training questions (`tracerl regime`), leaves 30.5% of them mixed, 45.3% all-fail and 24.2%
all-success. The first shipped build (2-4 hops, 10% noise, 8 turns, every question answerable: 85% mixed) is
`configs/multihop-easy.toml`. `metrics.json` records what a build measured; the default took 318 s with one
thread on a 2-core machine shared with another build, and scored 52.3% ± 5.9% on 64 held-out questions x 4.

Naming a policy: the cache folder is named by the config (`EmbeddedConfig.key`), but what a run starts from is named
by its weights: `weights_hash(model)` is the SHA-256 of the state dict's tensors in a canonical order, recorded in
`metrics.json` (`build/weights_sha256`) and by every run (`run_provenance`, written to `<run>/provenance.json` with
the code's hash, the torch version and the machine). The build runs on one torch thread whatever the caller set
(restored after), so its weights cannot depend on the caller's thread count: on a 16-core Intel Xeon, 1, 4 and 16
build threads gave three different weights for one config, and builds at 1 and at 16 threads repeated bit for bit
(on the 2-core AMD machine 1 and 2 threads gave the same). They also depend on the machine or the torch version: the
same configs built there and on the 2-core machine matched in no case (the two differ in CPU, torch 2.11 against
2.13, and Python, so which of these is not known; benchmarks/results/gpu-h200/build-portability-2026-11-27/). And
they depend on code changes that did not bump BUILD_VERSION. So a build is reproducible on one machine and torch
version, a cached build is loaded as is, and `tracerl compare` refuses to pair runs whose starting weights differ.

It does not do RL or load real checkpoints or tokenizers (`TransformersEngine.from_pretrained` does).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import math
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tracerl.engines import torch_threads
from tracerl.engines.tiny import tiny_qwen3
from tracerl.io.domains.base import Domain
from tracerl.io.domains.multihop import RELATIONS, MultiHopDomain, read_fact
from tracerl.io.env import EpisodeError
from tracerl.io.files.run_folder import run_path, write_atomic
from tracerl.io.files.runlog import PROVENANCE_FILE
from tracerl.io.rollout.chat import ChatRenderer
from tracerl.io.rollout.driver import DriverLimits
from tracerl.io.rollout.tokenizer import train_tokenizer
from tracerl.policy.embedded_config import BUILD_VERSION, KEYLESS_DEFAULTS, EmbeddedConfig  # noqa: F401 (public here)
from tracerl.policy.evaluation import evaluate_rows

BUILD_THREADS = 1  # torch threads of a build: a thread count can change float summation order, so the weights
DOMAIN_BUILD_VERSION = 2  # in the key of a build for another domain than multihop: bump it when such builds change

Progress = Callable[[str], None]


@dataclass
class EmbeddedPolicy:
    tokenizer: Any  # transformers.PreTrainedTokenizerFast with the chat template
    model: torch.nn.Module  # Qwen3ForCausalLM, float32, eval mode
    renderer: ChatRenderer
    domain: Any  # MultiHopDomain, or the user's task it was built for
    config: EmbeddedConfig
    path: Path  # the cache folder it was saved to / loaded from

    def metrics(self) -> dict[str, Any]:
        return json.loads((self.path / "metrics.json").read_text())

    def weights_hash(self) -> str:
        return weights_hash(self.model)


def weights_hash(model: torch.nn.Module | dict[str, torch.Tensor]) -> str:
    """SHA-256 (hex) of a model's weights: for every state-dict entry in sorted name order, its name, dtype, shape
    and raw bytes. Equal hashes mean bit-identical weights under the same names; the device does not enter it."""
    state = model.state_dict() if isinstance(model, torch.nn.Module) else model
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().to("cpu").contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def machine_description() -> dict[str, Any]:
    """What a float result can depend on besides the code: torch and transformers versions, CPU, GPU, threads."""
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "cpu": cpu, "num_cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


@functools.cache
def source_hash(package: Path | None = None) -> str:
    """SHA-256 (hex) of tracerl's own code as imported (or of the package folder `package`): every `.py` file of it,
    by its path inside the package and its bytes, in sorted path order. Equal hashes mean the same code, installed or
    checked out; compiled files, data and the folder's location do not enter it."""
    package = Path(__file__).resolve().parent.parent if package is None else Path(package)
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        data = path.read_bytes()
        digest.update(f"{path.relative_to(package).as_posix()}|{len(data)}|".encode() + data)
    return digest.hexdigest()


def run_provenance(model: torch.nn.Module | dict[str, torch.Tensor], source: str = "") -> dict[str, Any]:
    """What a run starts from: the weights hash (`weights_hash` of the weights a sampler would load; with LoRA the
    merged weights, equal to the base model's at step 0), where they came from (`source`: a cache folder, a model
    directory), the code that runs (`source_hash`, with tracerl's version) and the machine (`machine_description`)."""
    from tracerl import __version__

    return {"weights_sha256": weights_hash(model), "source": str(source), "tracerl": __version__,
            "code_sha256": source_hash(), **machine_description()}


def write_provenance(run_dir: str | Path, provenance: dict[str, Any]) -> Path:
    """`<run_dir>/provenance.json`, written once: a resumed run keeps the record of the weights it started from."""
    path = run_path(run_dir, PROVENANCE_FILE)  # a symlink there is refused, never followed
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(provenance, indent=1).encode())
    return path


def note_resumed_code(run_dir: str | Path) -> None:
    """A run resumed under other code than the code it started or was resumed under: that code's hash (`source_hash`)
    joins the record's `code_sha256_resumed`, so a run whose steps ran two versions of the code says so."""
    path = run_path(run_dir, PROVENANCE_FILE)
    if not path.exists():
        return
    record = json.loads(path.read_text())
    code, resumed = source_hash(), record.get("code_sha256_resumed", [])
    if code != record.get("code_sha256") and code not in resumed:
        record["code_sha256_resumed"] = [*resumed, code]
        write_atomic(path, json.dumps(record, indent=1).encode())


def default_cache_dir() -> Path:
    """$TRACERL_CACHE, else ~/.cache/tracerl."""
    return Path(os.environ.get("TRACERL_CACHE") or Path.home() / ".cache" / "tracerl")


# ------------------------------------------------------------------------------------------------ expert traces

@dataclass
class Episode:
    row: dict[str, Any]
    turns: list[tuple[str, str | None, str]]  # (action, observation or None after the last turn, observation role)
    reward: float
    num_noisy_turns: int


def _position(row: dict[str, Any], turns: Sequence[tuple[str, str]]) -> tuple[str, int]:
    """(entity reached, hops done) after `turns`, tracked as the expert tracks it (from observations only)."""
    entity, relations, hop = row["extra_info"]["start"], row["extra_info"]["relations"], 0
    for _action, observation in turns:
        found = read_fact(observation, entity, relations[hop]) if hop < len(relations) else None
        entity, hop = (found, hop + 1) if found else (entity, hop)
    return entity, hop


def noisy_turn(domain: MultiHopDomain, row: dict[str, Any], turns: Sequence[tuple[str, str]],
               rng: np.random.Generator) -> str:
    """A plausible wrong action, in the expert's words: search a look-alike of the current entity, or answer now
    (the current entity before the last hop, a look-alike of the answer after it)."""
    entity, hop = _position(row, turns)
    relations = row["extra_info"]["relations"]
    words = set(entity.split())
    lookalikes = sorted(n for n in domain.kb.entities if n != entity and words & set(n.split()))
    twin = str(rng.choice(lookalikes)) if lookalikes else entity
    if hop < len(relations) and rng.random() < 0.5:
        rel = RELATIONS[relations[hop]]
        call = json.dumps({"name": "search", "arguments": {"query": f"{twin} {rel.query}"}})
        return f"I need {rel.phrase.format(x=twin)}.\n<tool_call>{call}</tool_call>"
    answer = entity if hop < len(relations) else twin
    return f"The answer is {answer}.\n<answer>{answer}</answer>"


def spaced(action: str) -> str:
    """The action with a space before the name it copies into a query or an answer.

    Byte-level BPE gives 'Arlo' and ' Arlo' different ids, and names elsewhere (question, documents) follow a
    space; without this a tiny model must learn the mapping for every name instead of copying the tokens it sees.
    The environment strips the space (queries are whitespace-normalised, answers stripped)."""
    return action.replace('"query": "', '"query": " ').replace("<answer>", "<answer> ")


def expert_episode(domain: Any, row: dict[str, Any], rng: np.random.Generator, p_noise_turn: float,
                   max_turns: int, others: Sequence[dict[str, Any]] = ()) -> Episode:
    """One episode of the expert, each turn replaced with probability p_noise_turn by `noisy_turn` (multihop) or,
    for a user's task, by the expert's turn for another row of `others` at the same point (a plausible wrong call)."""
    multihop = isinstance(domain, MultiHopDomain)
    env = domain.make_env()
    env.reset(row)
    history: list[tuple[str, str]] = []
    turns, noisy = [], 0
    for _ in range(max_turns):
        wrong = rng.random() < p_noise_turn and (multihop or len(others) > 1)
        noisy += wrong
        if multihop:
            action = spaced(noisy_turn(domain, row, history, rng) if wrong else domain.expert_turn(row, history, rng))
        else:
            source = others[int(rng.integers(len(others)))] if wrong else row
            action = domain.expert_turn(source, history, rng)
        try:
            result = env.step(action)
        except EpisodeError:  # a user's reward that failed: a failed demonstration (the driver makes it a failed leaf)
            turns.append((action, None, ""))
            return Episode(row, turns, 0.0, noisy)
        if result.done:
            turns.append((action, None, ""))
            return Episode(row, turns, float(result.reward), noisy)
        turns.append((action, result.observation, result.info.get("role", "tool")))
        history.append((action, result.observation))
    turns[-1] = (turns[-1][0], None, "")  # the driver ends a rollout at max_turns without its observation
    return Episode(row, turns, 0.0, noisy)


def render_episode(renderer: ChatRenderer, episode: Episode, tools: list[dict[str, Any]],
                   limits: DriverLimits) -> tuple[list[int], list[int]]:
    """(token ids, mask) of an episode exactly as `ReActDriver` lays out a rollout: the prompt (mask 0), then per
    turn the policy text + end-of-turn token (mask 1) and the rendered observation (mask 0)."""
    ids = renderer.prompt_ids(episode.row["prompt"], tools)
    mask = [0] * len(ids)
    for action, observation, role in episode.turns:
        policy = renderer.encode(action) + [renderer.stop_token_ids[0]]
        ids, mask = ids + policy, mask + [1] * len(policy)
        if observation is not None:
            if len(observation) > limits.max_observation_chars:
                observation = observation[: limits.max_observation_chars] + " [observation truncated]"
            inserted = renderer.encode(renderer.observation_text(observation, role=role))
            ids, mask = ids + inserted, mask + [0] * len(inserted)
    return ids, mask


# ------------------------------------------------------------------------------------------------ SFT

def sft_loss(model: torch.nn.Module, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over policy tokens: -1/N sum_{t: mask[t]=1} log p(x_t | x_<t).

    Rows are right-padded (padding has mask 0 and, being after every real token, is never attended to by one), so
    no attention mask is needed. Logits are computed only where a policy token is predicted: the LM head over the
    whole sequence would cost as much as the transformer blocks."""
    hidden = model.model(input_ids=input_ids).last_hidden_state  # (B, T, H)
    predicts = mask[:, 1:].bool()  # (B, T-1): position t predicts token t+1
    logits = model.lm_head(hidden[:, :-1][predicts])  # (N, V)
    return torch.nn.functional.cross_entropy(logits.float(), input_ids[:, 1:][predicts])


def _batches(lengths: np.ndarray, batch_size: int, rng: np.random.Generator):
    """Endless batches of trace indices, each drawn from traces of similar length (less padding), in random order."""
    while True:
        order = rng.permutation(len(lengths))
        chunks = [order[i: i + 16 * batch_size] for i in range(0, len(order), 16 * batch_size)]
        batches = [c[np.argsort(lengths[c], kind="stable")][j: j + batch_size]
                   for c in chunks for j in range(0, len(c), batch_size)]
        for b in rng.permutation(len(batches)):
            yield batches[b]


def train_sft(model: torch.nn.Module, traces: Sequence[tuple[list[int], list[int]]], config: EmbeddedConfig,
              pad_id: int, progress: Progress) -> list[float]:
    """AdamW on `sft_loss` for config.sft_steps steps; returns the loss of every step."""
    rng = np.random.default_rng([config.seed, 1])
    lengths = np.array([len(ids) for ids, _ in traces])
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=0.01)
    warmup = max(1, config.sft_steps // 20)

    def lr_at(step: int) -> float:  # linear warmup, then cosine from lr to lr / 10
        if step < warmup:
            return config.lr * (step + 1) / warmup
        t = (step - warmup) / max(1, config.sft_steps - warmup)
        return config.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * t)))

    model.train()
    losses, start, batches = [], time.perf_counter(), _batches(lengths, config.batch_size, rng)
    every = max(1, config.sft_steps // 10)  # progress messages
    for step in range(config.sft_steps):
        index = next(batches)
        width = int(lengths[index].max())
        input_ids = torch.full((len(index), width), pad_id, dtype=torch.long)  # (B, T)
        mask = torch.zeros(len(index), width, dtype=torch.long)  # (B, T)
        for row, i in enumerate(index):
            input_ids[row, : lengths[i]] = torch.tensor(traces[i][0])
            mask[row, : lengths[i]] = torch.tensor(traces[i][1])
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        loss = sft_loss(model, input_ids, mask)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if (step + 1) % every == 0 or step + 1 == config.sft_steps:
            progress(f"SFT step {step + 1}/{config.sft_steps}: loss {np.mean(losses[-every:]):.3f} "
                     f"({time.perf_counter() - start:.0f} s)")
    model.eval()
    return losses


# ------------------------------------------------------------------------------------------------ build and load

def build_embedded(config: EmbeddedConfig = EmbeddedConfig(), cache_dir: str | Path | None = None, *,
                   rebuild: bool = False, progress: Progress | None = None, domain: Any = None) -> EmbeddedPolicy:
    """Load the policy of `config` from `cache_dir/<config.key()>/`, or build it there (see the module docstring).

    cache_dir defaults to $TRACERL_CACHE or ~/.cache/tracerl; rebuild=True builds anew and replaces the cache.
    `domain` is a built-in domain with an expert (math, funcall) or a user's task (`tracerl.io.env.task.UserTaskDomain`)
    in place of the multihop world; its name and fingerprint join the cache key, and the multihop fields of `config`
    are then unused. A build runs on BUILD_THREADS torch threads, whatever the caller set (restored on return)."""
    say = progress or (lambda message: None)
    key = config.key() if domain is None else f"{config.key()}-{_domain_key(domain)}"
    path = Path(cache_dir or default_cache_dir()) / key
    if (path / "metrics.json").exists() and not rebuild:
        say(f"loading the embedded policy from {path}")
        return load_embedded(path, domain)
    with _build_lock(path, say):
        if (path / "metrics.json").exists() and not rebuild:  # another process built it while this one waited
            say(f"loading the embedded policy from {path}, built meanwhile by another process")
            return load_embedded(path, domain)
        with torch_threads(BUILD_THREADS):
            return _build(config, path, say, domain)


@contextlib.contextmanager
def _build_lock(path: Path, say: Progress) -> Iterator[None]:
    """Held while one process builds the policy at `path`: `tracerl compare --jobs N` starts N runs of one build
    at once, and each would otherwise build the same weights (minutes of both cores). flock(2) on `<path>.lock`
    beside the cache entry: the kernel drops it when its holder dies, so a killed build never blocks the next."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f"{path.name}.lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for another process building the embedded policy at {path}")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# The split the build's held-out check reads (`eval/success` in its metrics.json): apart from the warm start's questions
# (multihop's own warmup split, or the training split) and from RL's.
CHECK_SPLIT = "test"


def warmup_seed(seed: int) -> int:
    """The seed a built-in domain's warm-start rows are drawn with: a stream no small run seed draws."""
    return 1_000_003 + seed


def _domain_key(domain: Any) -> str:
    """The cache key's domain part: '<name><DOMAIN_BUILD_VERSION>-<fingerprint>', the name 'task' for a user's task."""
    return f"{domain.name if isinstance(domain, Domain) else 'task'}{DOMAIN_BUILD_VERSION}-{domain.fingerprint()}"


def _warmup_rows(domain: Any, config: EmbeddedConfig, own_world: bool) -> list[dict[str, Any]]:
    """The warm start's questions: multihop's own split (apart from RL's and the test's), a built-in domain's training
    split drawn with `warmup_seed` (and `config.warmup_options` in place of the domain's own, e.g. a template mix
    that leaves room for RL), a user's task's training rows."""
    if own_world:
        if config.warmup_options:
            raise ValueError("warmup_options with the multihop world: its warm start's questions are set by "
                             "warmup_hop_mix")
        return domain.rows("warmup", config.num_train_rows, seed=config.seed)
    if not isinstance(domain, Domain):
        if config.warmup_options:
            raise ValueError("policy.embedded.warmup_options applies to a built-in domain; a task of your own picks "
                             "its warm-start rows itself (UserTask rows)")
        return domain.rows("train", config.num_train_rows, seed=config.seed)
    source = domain.with_options(**config.warmup_options) if config.warmup_options else domain
    return source.rows("train", config.num_train_rows, seed=warmup_seed(config.seed))


def _expert_episodes(domain: Any, rows: list[dict[str, Any]], config: EmbeddedConfig, own_world: bool) -> list[Episode]:
    """One expert episode per row. Multihop's draw from one stream, in order (as its builds always have); another
    domain's each from a stream of its own (`[seed, 0, i]`), so the same traces come out in any order: a built-in
    domain's run side by side in threads while a tool call waits (math runs every program in a sandbox process); a
    user's task's run one by one, as its code need not be thread-safe."""
    if own_world:
        rng = np.random.default_rng([config.seed, 0])
        return [expert_episode(domain, row, rng, config.p_noise_turn, config.max_turns, rows) for row in rows]

    def one(i: int) -> Episode:
        return expert_episode(domain, rows[i], np.random.default_rng([config.seed, 0, i]), config.p_noise_turn,
                              config.max_turns, rows)

    if not isinstance(domain, Domain):
        return [one(i) for i in range(len(rows))]
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        return list(pool.map(one, range(len(rows))))


def _build(config: EmbeddedConfig, path: Path, say: Progress, domain: Any) -> EmbeddedPolicy:
    started = time.perf_counter()
    own_world = domain is None  # the multihop world the config describes
    domain = domain or config.make_domain()
    rows = _warmup_rows(domain, config, own_world)
    say(f"{len(rows)} expert traces on questions of the {'warmup' if own_world else 'train'} split")
    episodes = _expert_episodes(domain, rows, config, own_world)
    documents = [f"{d['title']}: {d['text']}" for d in domain.kb.documents] if hasattr(domain, "kb") else []
    schemas = [] if own_world else [json.dumps(domain.make_env().tools())]  # multihop's build stays as it was
    texts = (documents + schemas + [r["prompt"][-1]["content"] for r in rows]
             + [text for e in episodes for a, o, _ in e.turns for text in (a, o or "")])
    say(f"training a {config.vocab_size}-token tokenizer on {len(texts)} texts")
    tokenizer = train_tokenizer(texts, vocab_size=config.vocab_size, split_digits=config.split_digits)
    renderer = ChatRenderer(tokenizer)
    tools, limits = domain.make_env().tools(), config.limits()
    traces = [render_episode(renderer, e, tools, limits) for e in episodes]
    num_cut = sum(len(ids) > config.max_seq_tokens for ids, _ in traces)
    traces = [(ids[: config.max_seq_tokens], mask[: config.max_seq_tokens]) for ids, mask in traces]
    model = tiny_qwen3(len(tokenizer), config.hidden_size, config.num_layers, config.num_heads, config.num_kv_heads,
                       seed=config.seed, max_position_embeddings=max(4096, config.max_seq_tokens))
    num_params = sum(p.numel() for p in model.parameters())
    say(f"supervised warm start of a {num_params / 1e6:.2f}M-parameter Qwen3 on {len(traces)} expert traces "
        f"({np.mean([e.reward for e in episodes]):.0%} of them succeed)")
    sft_started = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        losses = train_sft(model, traces, config, tokenizer.pad_token_id, say)
    sft_seconds = time.perf_counter() - sft_started
    policy = EmbeddedPolicy(tokenizer, model, renderer, domain, config, path)
    result = evaluate(policy, CHECK_SPLIT, config.num_eval_prompts, config.eval_samples_per_prompt, seed=config.seed)
    say(f"held-out success on the {CHECK_SPLIT} split {result['eval/success']:.1%} +- {result['eval/success_se']:.1%} "
        f"({config.num_eval_prompts} questions x {config.eval_samples_per_prompt} samples, temperature 1)")
    window = max(1, len(losses) // 50)  # the loss curve as at most ~50 window means
    metrics = {"train/sft_loss_curve": [float(np.mean(losses[i: i + window])) for i in range(0, len(losses), window)],
               "train/sft_loss_window_steps": window, "train/sft_seconds": sft_seconds,
               "train/num_traces": len(traces), "train/num_traces_cut": num_cut,
               "train/trace_success": float(np.mean([e.reward for e in episodes])),
               "train/noisy_turn_share": sum(e.num_noisy_turns for e in episodes) / sum(len(e.turns) for e in episodes),
               "train/mean_trace_tokens": float(np.mean([len(ids) for ids, _ in traces])),
               "train/num_parameters": num_params, "train/vocab_size": len(tokenizer),
               "build/weights_sha256": weights_hash(model), "build/machine": machine_description(),
               "sys/build_seconds": time.perf_counter() - started, **result}
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # its "Writing model shards" bar would break tracerl's own progress bar
    _save(policy, metrics)
    say(f"saved the embedded policy to {path} ({metrics['sys/build_seconds']:.0f} s, weights sha256 "
        f"{metrics['build/weights_sha256'][:16]})")
    return load_embedded(path, None if own_world else domain)  # as later calls load it (module docstring)


def _save(policy: EmbeddedPolicy, metrics: dict[str, Any]) -> None:
    """Write into a temporary sibling folder, then rename it into place (a reader sees all of it or nothing)."""
    path = policy.path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        policy.tokenizer.save_pretrained(tmp / "tokenizer")
        policy.model.save_pretrained(tmp / "model")
        (tmp / "embedded_config.json").write_text(json.dumps(policy.config.to_dict(), indent=1))
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=1))
        if path.exists():  # rebuild: move the old build aside first (a folder cannot replace a non-empty one)
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}-old-", dir=path.parent))
            os.replace(path, old / "build")
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone after a successful rename; cleans up a failed write


def load_embedded(path: str | Path, domain: Any = None) -> EmbeddedPolicy:
    """A policy saved by `build_embedded` (local files only, no network); `domain` as given to the build."""
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # its loading bar would break tracerl's own progress bar

    path = Path(path)
    if not (path / "metrics.json").exists():
        raise FileNotFoundError(f"{path} holds no complete embedded build; run build_embedded(config, cache_dir)")
    config = EmbeddedConfig.from_dict(json.loads((path / "embedded_config.json").read_text()))
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path / "tokenizer", local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path / "model", dtype=torch.float32, local_files_only=True).eval()
    return EmbeddedPolicy(tokenizer, model, ChatRenderer(tokenizer), domain or config.make_domain(), config, path)


# ------------------------------------------------------------------------------------------------ evaluation

def evaluate(policy: EmbeddedPolicy, split: str = "test", num_prompts: int = 64, samples_per_prompt: int = 4,
             temperature: float = 1.0, seed: int = 0) -> dict[str, Any]:
    """`evaluate_rows` on `num_prompts` questions of `split` (drawn with `seed`), through the real driver."""
    rows = policy.domain.rows(split, num_prompts, seed=seed)
    return evaluate_rows(policy.model, policy.renderer, policy.domain, policy.config.limits(), rows,
                         samples_per_prompt, temperature, seed=seed)
