"""The training loop: one TRACE step, top to bottom, for every method preset; checkpoints; held-out evaluation.

`Trainer.train_step` is the whole algorithm of docs/design.md (section 2) on a real policy:

    candidate pool -> predictor -> stage 1 -> bare rollouts -> stage 2 -> rewards -> natural backup targets
    -> predictor scored on the step's fresh nodes, then updated -> advantages -> policy update

Pool, predictor, allocation, predictor update, advantages and measures are one call on the run's
`tracerl.core.step.Sampler` (the same step `tracerl bench alloc` runs on the simulator), which also holds their state
for checkpoints; rollouts run on the runner `tracerl.executors.make_runner` gives (the `ReActDriver` over the
policy's engine in this process, or Ray workers that are clients of a served engine); the update is
the clipped token-level surrogate of `tracerl.train.loss`, per rollout or on packed trees. The model, the
reference model, the in-process engine and each micro-batch live on `policy.device`; with LoRA (`policy.lora_rank`)
only the adapters are trained, the KL reference is the model with its adapters switched off, and a served engine
receives the merged weights (`tracerl.train.policy`).

The policy is built before the trainer, as a step of its own (`tracerl.train.policy.load_policy`: the embedded build,
from its cache or trained on first use, or a model path), and given to it: `Trainer(config, load_policy(config))`.

Every step's sampling draws on seeds derived from (run seed, step), and every other random state (data order,
allocation, predictor) is saved in the checkpoint, so a run resumed from a checkpoint produces the same metrics
as one that never stopped (`tests/e2e`).

Deliberately not here: distributed training, learning-rate schedules, a value model.
"""

from __future__ import annotations

import copy
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tracerl.core.advantages import TreeAdvantages
from tracerl.core.methods import get_method
from tracerl.core.tally import rollouts, to_columns
from tracerl.core.predictor import make_predictor
from tracerl.core.step import Sampler, StepResult
from tracerl.core.tree import Tree
from tracerl.engines import make_engine, torch_threads
from tracerl.executors import make_runner
from tracerl.io.files.boundary import listing
from tracerl.io.files.run_folder import replacing, run_path
from tracerl.io.files.runlog import METRICS_FILE, RunLog, run_lock, write_rollouts, write_trees
from tracerl.io.rollout.driver import ReActDriver, check_prompt_lengths
from tracerl.io.rollout.engine import SamplingParams
from tracerl.policy.embedded import note_resumed_code, run_provenance, write_provenance
from tracerl.policy.evaluation import evaluate_rows
from tracerl.train import checkpoint
from tracerl.train.batch import packed_batch, rollout_batch
from tracerl.train.config import RESUMABLE_CHANGES, TrainConfig, resume_differences
from tracerl.train.loss import batch_logprobs, batch_policy_loss
from tracerl.train.policy import (TrainPolicy, autocast, compute_dtype, load_policy, merged_state_dict,
                                  sampling_dtype, trainable_parameters)

Say = Callable[[str], None]


def step_seed(seed: int, step: int, stream: int) -> int:
    """A sampling seed for (run seed, step, stream), stable across processes (no Python hash randomisation)."""
    return int(np.random.default_rng([seed, step, stream]).integers(2**31 - 1))


def rollout_policy_tokens(tree: Tree) -> int:
    """Policy tokens summed over the tree's rollouts (a shared segment counts once per leaf below it)."""
    return sum(tree.nodes[i].segment.num_policy_tokens for leaf in tree.leaves() for i in tree.path(leaf))


class Trainer:
    """Holds the policy, engine, predictor, optimiser and run state of one run directory.

    `policy` is the run's policy as `load_policy(config)` returns it (built or loaded, on `policy.device`, with LoRA
    adapters when `policy.lora_rank` > 0); the trainer trains its model in place, and its KL reference (full
    fine-tuning with `optim.kl_coef` > 0) is a frozen copy of the weights as given."""

    def __init__(self, config: TrainConfig, policy: TrainPolicy, *, say: Say | None = None):
        config.check_machine()  # Ray, the CUDA device, peft, the model: what a config built in code skipped
        self.config = config
        self.say = say or (lambda message: None)
        self.method = get_method(config.method)
        self.out = config.out_dir()
        self.policy = policy
        self.model = self.policy.model
        self.device = self.policy.device
        # transformers: the model with its adapters inside its layers, so it samples the adapted policy; vLLM: loaded
        # with the merged weights; a server: samples this model, so its ids must lie inside this model's vocabulary
        self.engine = make_engine(config.policy, self.model, device=self.device,
                                  compute_dtype=sampling_dtype(self.device, config.policy.precision),
                                  weights=lambda: merged_state_dict(self.model), seed=config.run.seed, say=self.say)
        self.ref_model = None  # a frozen copy of the initial policy (KL term, full fine-tuning)
        if config.optim.kl_coef > 0 and self.policy.peft is None:  # with LoRA the base model is the reference
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.optimizer = torch.optim.AdamW(trainable_parameters(self.model), lr=config.optim.lr,
                                           betas=config.optim.betas, weight_decay=config.optim.weight_decay)
        self.uses_predictor = self.method.predictor != "none"
        seed = config.run.seed
        predictor = None
        if self.uses_predictor:  # steered by the domain's state features as well as the text
            predictor = make_predictor(config.predictor.name, seed=seed,
                                       state_features=self.policy.domain.state_features,
                                       **config.predictor.options)
        self.train_rows = self.policy.domain.rows("train", config.data.num_train_prompts, seed=seed)
        self.eval_rows = self.policy.domain.rows("test", config.run.eval_prompts, seed=seed)
        for split, rows in (("train", self.train_rows), ("test", self.eval_rows)):  # a row too long fails at load
            check_prompt_lengths(rows, self.policy.renderer, self.policy.domain, context_tokens=self.context_tokens(),
                                 max_tokens_per_turn=self.policy.limits.max_tokens_per_turn, split=split)
        self.sampler = Sampler(self.method, config.allocation, len(self.train_rows), seed, predictor=predictor,
                               advantages=config.advantages)
        self.step = 0
        self.totals = {"units": 0.0, "tokens": 0, "prompts": 0, "rollouts": 0}
        self.log = RunLog(self.out, tensorboard=config.run.tensorboard)
        self.runner = None  # built by the first step (`start_runner`), kept until `close`

    def context_tokens(self) -> int | None:
        """Positions a prefix plus one turn may fill: the model's, or policy.vllm_max_model_len when vLLM samples
        in this process and it is smaller (a served engine serves this model; None when the config has no limit)."""
        positions = getattr(self.model.config, "max_position_embeddings", None)
        if self.config.policy.engine == "vllm":
            return min(positions or self.config.policy.vllm_max_model_len, self.config.policy.vllm_max_model_len)
        return positions

    def sync_weights(self) -> None:
        """Send the current weights to a served engine (policy.engine="openai", policy.sync_weights), so it
        samples the next step from the policy being trained. Written atomically to <run>/sync/weights.pt first.
        With LoRA these are the plain model's weights with the adapters merged in (the server has no adapters).
        An in-process vLLM engine (policy.engine="vllm") always loads them, from memory."""
        if self.config.policy.engine == "vllm":
            self.engine.load_weights(merged_state_dict(self.model))
            return
        if self.config.policy.engine != "openai" or not self.config.policy.sync_weights:
            return
        path = run_path(self.out, "sync", "weights.pt")  # never written through a symlink (tracerl.io.files.run_folder)
        path.parent.mkdir(parents=True, exist_ok=True)
        with replacing(path, fsync=False) as f:  # the server reads it now; a crash loses nothing of the run
            torch.save(merged_state_dict(self.model), f)
        self.engine.load_weights(str(path.resolve()))

    def start_runner(self):
        """The run's rollout runner (`tracerl.executors.make_runner`: this process, or Ray workers), built on first
        use and kept until `close`."""
        if self.runner is None:
            self.runner = make_runner(self.config, self.policy, self.engine, self.out, self.say)
        return self.runner

    def close(self) -> None:
        """Stop the runner (Ray workers, and a local Ray cluster it started); shut down an in-process vLLM engine."""
        if self.config.policy.engine == "vllm" and self.engine is not None:
            self.engine.close()
        if self.runner is not None:
            self.runner.close()
            self.runner = None

    # ------------------------------------------------------------------------------------------------ one step
    def train_step(self) -> dict[str, Any]:
        cfg = self.config
        started = time.perf_counter()
        step = self.sample_step()  # 1. the sampling: pool, stages 1 and 2, predictor, advantages
        trees, grown, ledger = step.trees, step.growth, step.ledger
        if cfg.run.save_trees:
            write_trees(self.out, self.step + 1, {
                "step": self.step + 1, "method": cfg.method, "domain": cfg.data.domain,
                "pool": [{"prompt_id": h.prompt_id, "p": float(p) if self.uses_predictor else None, "granted": int(m)}
                         for h, p, m in zip(step.pool, grown.p_pool, grown.root_counts)],
                "trees": [tree.to_dict() for tree in trees]})
        write_rollouts(self.out, self.step + 1, to_columns(rollouts(  # a few kB: the stage-2 tables without trees
            trees, self.method.advantage, cfg.advantages, ledger, advantages=step.advantages)))  # the step's own
        metrics: dict[str, Any] = dict(step.metrics)
        # 2. the policy update
        t0 = time.perf_counter()
        if hasattr(self.engine, "sleep"):  # in-process vLLM on a GPU frees its memory for the update
            self.engine.sleep()
        metrics.update(self.update_policy(trees, step.advantages))
        self.sync_weights()
        train_seconds = time.perf_counter() - t0
        # 3. run totals and times
        self.step += 1
        step_seconds = time.perf_counter() - started
        alloc_seconds = step.seconds["predict"] + step.seconds["allocate"] + step.seconds["update"]
        self.totals["units"] += ledger.units_spent
        self.totals["tokens"] += ledger.tokens_spent
        self.totals["prompts"] += len(trees)
        self.totals["rollouts"] += step.counts["num_leaves"]
        metrics.update({
            "alloc/overhead_frac": alloc_seconds / step_seconds,
            "rollout/cum_units": self.totals["units"], "rollout/cum_tokens": self.totals["tokens"],
            **{f"rollout/{k.split('/', 1)[1]}": v for k, v in self.runner.take_counters().items()},
            "sys/step_seconds": step_seconds, "sys/rollout_seconds": step.seconds["rollout"],
            "sys/train_seconds": train_seconds, "sys/alloc_seconds": alloc_seconds,
        })
        return self.log.write("train", self.step, metrics)

    def sample_step(self) -> StepResult:
        """The step's sampling (tracerl.core.step): the next pool, predictor, stage 1, rollouts, stage 2, predictor
        scored then updated, advantages, measures, on the run's runner with the step's seed."""
        runner = self.start_runner()
        # Every step samples from an empty KV store, as a step resumed from a checkpoint does: a store kept from the
        # last step (valid when that step left the weights unchanged) would make this step's logprobs differ from a
        # resumed run's in the last bits, where reusing keys/values and recomputing them round differently.
        clear_cache = getattr(self.engine, "clear_cache", None)
        if clear_cache is not None:
            clear_cache()
        return self.sampler.step(runner.for_step(self.train_rows, seed=step_seed(self.config.run.seed, self.step, 0)))

    def update_policy(self, trees: list[Tree], advantages: list[TreeAdvantages]) -> dict[str, float]:
        """AdamW on the clipped surrogate over all of the step's rollouts, `num_epochs` passes.

        The loss normaliser is the whole step's (all policy tokens for token-mean, all rollouts for
        seq-mean-token-mean), so micro-batching does not change the gradient. Trees whose advantages are all zero
        add nothing to the gradient when there is no KL term; they are counted in the normaliser and skipped."""
        cfg = self.config.optim
        sums: dict[str, float] = {}
        weight = 0.0  # sum of the shares the metrics were averaged with
        self.model.train()
        for _ in range(cfg.num_epochs):
            parts, share, total, num_trained = self.accumulate_gradient(trees, advantages)
            weight += share
            for key, value in parts.items():
                sums[key] = sums.get(key, 0.0) + value
            grad_norm = self.apply_gradient()
        self.model.eval()
        sums = {key: value / weight for key, value in sums.items()} if weight else {}
        sums.update({"train/grad_norm": float(grad_norm),
                     "train/num_policy_tokens": float(total if cfg.agg == "token-mean" else 0),
                     "train/num_trained_trees": float(num_trained), "train/lr": cfg.lr})
        return sums

    def accumulate_gradient(self, trees: list[Tree], advantages: list[TreeAdvantages]
                            ) -> tuple[dict[str, float], float, float, int]:
        """Zero the gradients, then backpropagate the step's loss over `trees` into them (one epoch's gradient, before
        clipping). Returns (the loss parts summed with their shares, the sum of the shares, the loss normaliser, the
        number of trees that carried a term). The model's train/eval mode is the caller's."""
        cfg = self.config.optim
        token_mean = cfg.agg == "token-mean"
        total = sum(rollout_policy_tokens(t) for t in trees) if token_mean else sum(len(t.leaves()) for t in trees)
        with_kl = cfg.kl_coef > 0
        work = [(t, a) for t, a in zip(trees, advantages)
                if with_kl or any(np.any(np.asarray(v) != 0) for v in a.values)]
        sums: dict[str, float] = {}
        weight = 0.0
        self.optimizer.zero_grad(set_to_none=True)
        for chunk in _chunks(work, cfg.micro_batch_rollouts):
            make = packed_batch if cfg.packed else rollout_batch
            batch = make([t for t, _ in chunk], [a for _, a in chunk], pad_id=self.policy.pad_id)
            share = (batch.num_policy_tokens if token_mean else sum(len(a.leaf_ids) for _, a in chunk)) / total
            batch = batch.to(self.device)
            with autocast(self.device, compute_dtype(self.config.policy.precision)):  # no-op for float32
                ref = self.reference_logprobs(batch) if with_kl else None
                loss, parts = batch_policy_loss(self.model, batch, temperature=self.config.sampling.temperature,
                                                ref_logprobs=ref, clip_eps=cfg.clip_eps, agg=cfg.agg,
                                                clip_eps_high=cfg.clip_eps_high, kl_coef=cfg.kl_coef)
            (loss * share).backward()  # outside autocast: the backward runs each op in its forward's dtype
            weight += share
            for key, value in parts.items():
                if key != "train/num_policy_tokens":
                    sums[key] = sums.get(key, 0.0) + value * share
        return sums, weight, total, len(work)

    def reference_logprobs(self, batch) -> torch.Tensor:
        """(B, T) token logprobs of the initial policy for the KL term: the frozen copy, or with LoRA the same model
        with its adapters switched off (the base weights never change, and the adapters start at zero)."""
        temperature = self.config.sampling.temperature
        with torch.no_grad():
            if self.ref_model is not None:
                return batch_logprobs(self.ref_model, batch, temperature)
            with self.policy.peft.disable_adapter():
                return batch_logprobs(self.model, batch, temperature)

    def gradient(self, trees: list[Tree], advantages: list[TreeAdvantages]) -> tuple[torch.Tensor, float]:
        """The gradient of the step's loss over `trees` (one epoch of `update_policy`, before clipping) as one float64
        vector over the trainable parameters (in their order; zero where a parameter got none), and the loss
        normaliser. The gradient stays in the parameters' `.grad`, where `apply_gradient` steps on it; the model is
        left in eval mode."""
        self.model.train()
        _, _, total, _ = self.accumulate_gradient(trees, advantages)
        self.model.eval()
        params = trainable_parameters(self.model)
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).double() for p in params])
        return flat, float(total)

    def apply_gradient(self) -> torch.Tensor:
        """The update `update_policy` makes of the gradient in the parameters' `.grad`: clipped to `optim.grad_clip`
        (total norm; 0: no clip), then one optimizer step. Returns the norm before clipping."""
        grad_norm = torch.nn.utils.clip_grad_norm_(trainable_parameters(self.model),
                                                   self.config.optim.grad_clip or float("inf"))
        self.optimizer.step()
        return grad_norm

    def rollouts(self, rows: list[dict[str, Any]], samples: int, seed: int) -> tuple[list[Tree], int]:
        """`samples` fresh rollouts of each of `rows` from the policy being trained, on the trainer's engine at the
        run's sampling temperature with `seed`, outside the run's steps: the runner, the sampler and the step index
        are untouched. Returns (one tree per row, the tokens sampled)."""
        driver = ReActDriver(self.engine, self.policy.renderer, self.policy.domain, limits=self.policy.limits,
                             sampling=SamplingParams(temperature=self.config.sampling.temperature, seed=seed))
        driver.set_rows(rows)
        with torch.no_grad():
            return driver.run_roots(list(range(len(rows))), [samples] * len(rows))

    # ------------------------------------------------------------------------------------------------ evaluation
    def evaluate(self, log: bool = True) -> dict[str, Any]:
        """Held-out avg@k on the run's fixed evaluation questions (same questions and seed every time); `log`
        appends it to the run's metrics."""
        cfg = self.config.run
        result = evaluate_rows(self.model, self.policy.renderer, self.policy.domain, self.policy.limits,
                               self.eval_rows, cfg.eval_samples, cfg.eval_temperature, seed=cfg.seed,
                               max_batch_size=self.config.policy.max_batch_size, coupled=cfg.eval_coupled)
        result["rollout/cum_units"] = self.totals["units"]
        result["rollout/cum_tokens"] = self.totals["tokens"]
        return self.log.write("eval", self.step, result) if log else {"step": self.step, "kind": "eval", **result}

    # ------------------------------------------------------------------------------------------------ checkpoints
    def save(self) -> Path:
        state = {"step": self.step, "totals": self.totals, "sampler": self.sampler.state_dict()}
        return checkpoint.save(self.out, self.step, self.model, self.optimizer, None, state)

    def resume(self, config: dict[str, Any] | None = None) -> bool:
        """Load the latest checkpoint of the run directory, if any; returns whether one was loaded. The caller
        truncates the metrics log to the checkpoint's step (`run_training` does). `config`: what the checkpoint's
        own config must equal, up to `RESUMABLE_CHANGES` (a training resume passes the config it trains with, so a
        run whose config.json is gone is still held to what was trained); None: the run's `config.json` (`tracerl
        eval --checkpoint`, whose evaluation settings may differ from the run's)."""
        state = self.load_checkpoint(self.out, config)
        if state is None:
            return False
        self.restore(state)
        return True

    def load_checkpoint(self, run_dir: str | Path, config: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """The newest checkpoint of `run_dir` (this run's or another's) loaded into the model and the optimizer, its
        config checked as `resume` says (None: that run's `config.json`). Returns the trainer state it holds (`step`,
        `totals`, `sampler`), which `restore` applies, or None when the run has no checkpoint."""
        return checkpoint.load(run_dir, self.model, self.optimizer, None, config=config)

    def snapshot(self) -> dict[str, Any]:
        """A copy of what a step changes: `weights`, `optimizer` (its state), `sampler` (the pool's cursor, the
        allocation RNG, the prices, the predictor), `step` and `totals`; `restore` puts it back."""
        return {"weights": {k: v.clone() for k, v in self.model.state_dict().items()},
                "optimizer": copy.deepcopy(self.optimizer.state_dict()),
                "sampler": copy.deepcopy(self.sampler.state_dict()), "step": self.step, "totals": dict(self.totals)}

    def restore(self, state: dict[str, Any]) -> None:
        """Put back the parts of a `snapshot` that `state` holds (a checkpoint's trainer state holds `step`, `totals`
        and `sampler`). The optimizer takes the state's moments with this trainer's own settings (`optim.lr`,
        `betas`, `weight_decay`), which may differ from those the state was saved with."""
        if "weights" in state:
            with torch.no_grad():
                self.model.load_state_dict(state["weights"])
        if "optimizer" in state:
            self.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
            optim = self.config.optim
            for group in self.optimizer.param_groups:
                group.update(lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay)
        if "sampler" in state:
            self.sampler.load_state_dict(copy.deepcopy(state["sampler"]))
        if "step" in state:
            self.step = int(state["step"])
        if "totals" in state:
            self.totals = dict(state["totals"])

    def skip_steps(self, num: int) -> None:
        """Move on `num` steps without taking them: the sampler passes over their pools (`Sampler.skip_pools`) and
        the step index, which seeds a step's sampling, moves on by `num`; nothing else changes. The next step is then
        another draw of the step the run would take, on another pool and seed."""
        self.sampler.skip_pools(num)
        self.step += num


def _chunks(items: list, size: int) -> list[list]:
    """Consecutive groups of items with at most `size` rollouts each (a tree larger than `size` is alone)."""
    out, current, count = [], [], 0
    for item in items:
        leaves = len(item[1].leaf_ids)
        if current and count + leaves > size:
            out.append(current)
            current, count = [], 0
        current.append(item)
        count += leaves
    if current:
        out.append(current)
    return out


def format_eval(row: dict[str, Any]) -> str:
    return f"{row['eval/success']:.1%} ± {row['eval/success_se']:.1%}"


def run_training(config: TrainConfig, *, resume: bool = False, say: Say | None = None,
                 progress: Callable[[dict[str, Any]], None] | None = None,
                 initial_eval: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train `config.run.num_steps` steps (or until `run.total_token_budget` sampled tokens, if that comes first) with
    held-out evaluation before and after (and every `eval_every`).

    `initial_eval`: the step-0 evaluation row of another run with the same policy, evaluation questions and seed
    (it does not depend on the method), logged instead of evaluating again.
    Raises `tracerl.io.files.runlog.RunInUse` while another process trains the same run directory.
    Returns {"before": eval row, "after": eval row, "improvement": after - before, "out_dir": ...}."""
    with run_lock(config.out_dir()):  # RunInUse if another process trains this folder
        _check_run_dir(config, resume)  # under the lock: what another process did to the folder is done
        # the policy is built (an embedded build pins its own threads) and loaded, and the trainer made, outside
        # run.num_threads, as they always were: the same threads give the same weights and the same first draws
        trainer = Trainer(config, load_policy(config, say or (lambda message: None)), say=say)
        try:
            with torch_threads(config.run.num_threads):
                return _train(trainer, config, resume, say, progress, initial_eval)
        finally:
            trainer.close()  # the Ray rollout workers, also when a step raised


def _train(trainer: Trainer, config: TrainConfig, resume: bool, say: Say | None,
           progress: Callable[[dict[str, Any]], None] | None, initial_eval: dict[str, Any] | None) -> dict[str, Any]:
    record_provenance(trainer.out, trainer.model, trainer.policy.source)
    resumed = resume and trainer.resume(config.to_dict())
    if resume and not resumed:
        (say or print)(f"no checkpoint in {trainer.out}; starting from step 0")
    trainer.log.truncate_after(trainer.step)  # rows of steps after the checkpoint are written again
    trainer.sync_weights()  # a served engine starts from the run's weights, not whatever it held
    checkpoint.save_config(trainer.out, config.to_dict())
    rows = [r for r in _existing_evals(trainer) if r["step"] == 0]
    if rows:
        before = rows[0]
    elif initial_eval is not None and trainer.step == 0:
        before = trainer.log.write("eval", 0, {k: v for k, v in initial_eval.items() if k not in ("step", "kind")})
    else:
        before = trainer.evaluate()
    if say:
        say(f"held-out success before training: {format_eval(before)} ({len(trainer.eval_rows)} questions x "
            f"{config.run.eval_samples} samples)")
    after = before
    if config.run.executor == "ray" and not config.run.finished(trainer.step, trainer.totals["tokens"]):
        trainer.start_runner()  # here, so that starting Ray workers is not timed as part of the first step
    while not config.run.finished(trainer.step, trainer.totals["tokens"]):
        row = trainer.train_step()
        if progress:
            progress(row)
        last = config.run.finished(trainer.step, trainer.totals["tokens"])
        if config.run.evaluates_after(trainer.step) and not last:
            trainer.evaluate()
        if last or trainer.step % config.run.checkpoint_every == 0:
            trainer.save()
    evals = [r for r in _existing_evals(trainer) if r["step"] == trainer.step]
    after = evals[-1] if evals and trainer.step > 0 else trainer.evaluate()
    trainer.log.close()
    diff = _paired_difference(before, after)
    return {"before": before, "after": after, "improvement": after["eval/success"] - before["eval/success"],
            "improvement_se": diff, "out_dir": str(trainer.out), "steps": trainer.step,
            "cum_units": trainer.totals["units"], "cum_tokens": trainer.totals["tokens"],
            "report": write_report(trainer.out, say)}


def record_provenance(run_dir: Path, model: torch.nn.Module, source: str) -> None:
    """`<run>/provenance.json` (starting weights hash, torch, machine: `tracerl.policy.embedded.run_provenance`) for a
    run that has not started yet; `tracerl compare` refuses to pair runs whose starting weights differ. With LoRA the
    merged weights (at step 0 the adapters add nothing, so every run of a build hashes the same). A run with metrics
    but no record started before records were kept: hashing its weights now would name the wrong ones, so it stays
    without one. A run resumed under other code adds that code's hash to its record (`note_resumed_code`)."""
    if not (Path(run_dir) / "metrics.jsonl").exists():
        write_provenance(run_dir, run_provenance(merged_state_dict(model), source=source))
    else:
        note_resumed_code(run_dir)


def write_report(run_dir: Path, say: Say | None) -> str | None:
    """`<run>/report.md` with its plots (tracerl.report.run_report); None, with a note, when matplotlib is missing."""
    from tracerl.report.run_report import write_run_report

    try:
        return str(write_run_report(run_dir))
    except ImportError as err:  # the `torch` extra alone has no matplotlib
        (say or print)(f"no run report ({err}); pip install -e '.[train]' and run: tracerl report {run_dir}")
        return None


def _check_run_dir(config: TrainConfig, resume: bool) -> None:
    """A new run never writes into an old one; a resumed run keeps its config: the run's `config.json`
    (`resume_differences`) and, when it has one, its checkpoint's (`Trainer.resume`). A run folder with metrics but
    neither a config.json nor a checkpoint is refused: nothing says which config wrote its metrics."""
    out = config.out_dir()
    saved_path = run_path(out, checkpoint.CONFIG_FILE)
    if not resume:
        if os.path.lexists(out / METRICS_FILE):
            raise ValueError(f"{out} already holds a run; pass --resume to continue it, or choose another --out")
        return
    if not os.path.lexists(saved_path):
        if os.path.lexists(out / METRICS_FILE) and not os.path.lexists(out / "checkpoints" / "latest"):
            raise ValueError(f"{out} holds metrics but neither {checkpoint.CONFIG_FILE} nor a checkpoint, so nothing "
                             "says which config wrote them; restore its config.json, or start a new run with "
                             "another --out")
        return  # the checkpoint's own config is compared when it loads
    try:
        saved = checkpoint.read_json(saved_path)
    except (OSError, ValueError) as err:
        raise ValueError(f"{saved_path} is unreadable ({err}); copy the config.json of its latest checkpoint over it, "
                         "or start a new run with another --out") from None
    if not isinstance(saved, dict):
        raise ValueError(f"{saved_path} holds {type(saved).__name__}, not a config; copy the config.json of its "
                         "latest checkpoint over it, or start a new run with another --out")
    changed = resume_differences(saved, config)
    if changed:
        raise ValueError(f"--resume with a config that differs from {saved_path} in {listing(changed)}; resume with "
                         f"the same config (--config {saved_path}), or start a new run with another --out (only "
                         f"{', '.join(RESUMABLE_CHANGES)} may change)")


def _existing_evals(trainer: Trainer) -> list[dict[str, Any]]:
    from tracerl.io.files.runlog import read_metrics

    if not trainer.log.path.exists():
        return []
    return [r for r in read_metrics(trainer.out) if r["kind"] == "eval"]


def _paired_difference(before: dict[str, Any], after: dict[str, Any]) -> float:
    """Standard error of after - before over the same questions (paired by question)."""
    a, b = np.asarray(after.get("eval/per_prompt", [])), np.asarray(before.get("eval/per_prompt", []))
    if len(a) != len(b) or len(a) < 2:
        return float("nan")
    return float(np.std(a - b, ddof=1) / math.sqrt(len(a)))
