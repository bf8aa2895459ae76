"""What determines the embedded policy (`EmbeddedConfig`), apart from the build that needs torch
(`tracerl.policy.embedded`): so a run's config (`policy.embedded`, a typed section that `tracerl config` lists) and
its checks at load need no torch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from tracerl.io.domains.multihop import MultiHopDomain
from tracerl.io.files.boundary import listing
from tracerl.io.rollout.driver import DriverLimits

BUILD_VERSION = 2  # part of the cache key: bump it when a code change alters what a config builds
KEYLESS_DEFAULTS = {"warmup_hop_mix": [], "split_digits": False, "warmup_options": {}}  # fields added within BUILD_VERSION 2, as `to_dict` writes their defaults


@dataclass(frozen=True)
class EmbeddedConfig:
    """Everything that determines the embedded policy; its hash names the cache folder."""

    # -- task: the multihop world (MultiHopDomain), whose fields' docs start "(multihop only)" (`tracerl config`
    # prints them; another domain or a task of your own ignores these fields), then every domain's turn limits
    num_entities: int = 300  # (multihop only) real entities in the generated world; more = more distinct names to copy
    num_distractors: int = 120  # (multihop only) look-alike entities that crowd search results; more = harder reading
    hops: tuple[int, int] = (1, 5)  # (multihop only) inclusive range of relations per question; more = longer, harder
    hop_mix: tuple[float, ...] = ()  # (multihop only) weight of each hop count in every split (() = uniform over `hops`)
    warmup_hop_mix: tuple[float, ...] = ()  # (multihop only) hop weights of the warm start's questions only (() = hop_mix)
    missing_share: float = 0.0  # (multihop only) share of real entities without a document, drawn at random
    missing_kinds: tuple[str, ...] = ("university",)  # (multihop only) kinds of entity without documents (questions show them)
    unanswerable_share: float = 0.25  # (multihop only) share of questions needing a missing document (they cannot succeed)
    warmup_fraction: float = 0.3  # (multihop only) share of question chains kept for the warm start, apart from RL, test
    search_k: int = 1  # (multihop only) documents per search; 1 halves the trace length (the expert's query ranks first)
    domain_seed: int = 0  # (multihop only) seed of the world (documents and question pool)
    max_turns: int = 5  # policy turns per rollout, every domain (multihop: k hops need k + 1, so at 5, 5 hops cannot succeed)
    max_tokens_per_turn: int = 64  # sampled tokens per turn; an expert turn is about 30
    max_tokens_per_rollout: int = 1024  # policy + observation tokens after the prompt
    # -- expert traces
    warmup_options: dict = dataclasses.field(default_factory=dict)  # another domain's options for the warm start's rows only (e.g. funcall's templates)
    num_train_rows: int = 4000  # distinct training questions, one expert trace each (more = fewer repeats)
    p_noise_turn: float = 0.02  # chance that an expert turn is replaced by a plausible wrong action
    # -- tokenizer and model (tiny_qwen3)
    vocab_size: int = 1536  # BPE vocabulary trained on the task text (>= 267)
    split_digits: bool = False  # one token per digit, so numbers are copied digit by digit (math, amounts)
    hidden_size: int = 128  # model width; parameters grow with its square
    num_layers: int = 2  # transformer blocks
    num_heads: int = 4  # attention heads (hidden_size must divide by it)
    num_kv_heads: int = 2  # key/value heads (num_heads must divide by it)
    # -- supervised warm start
    sft_steps: int = 3000  # optimizer steps: the main knob for how good the warm start is, and for build time
    batch_size: int = 8  # traces per step
    lr: float = 6e-3  # peak AdamW learning rate (linear warmup over 5% of steps, cosine decay to 10%)
    max_seq_tokens: int = 1024  # traces longer than this are cut (counted in metrics)
    # -- measurement written to metrics.json
    num_eval_prompts: int = 64  # held-out questions evaluated after the build
    eval_samples_per_prompt: int = 4  # rollouts per held-out question (temperature 1)
    seed: int = 0  # seed of the trace noise, model init, batch order and evaluation sampling

    def __post_init__(self) -> None:
        if not 0 <= self.p_noise_turn < 1:
            raise ValueError(f"p_noise_turn={self.p_noise_turn} must be in [0, 1); 0 gives clean expert traces")
        if min(self.sft_steps, self.batch_size, self.num_train_rows, self.num_eval_prompts,
               self.eval_samples_per_prompt) < 1:
            raise ValueError(f"sft_steps, batch_size, num_train_rows, num_eval_prompts and eval_samples_per_prompt "
                             f"must be >= 1 (got {self.sft_steps}, {self.batch_size}, {self.num_train_rows}, "
                             f"{self.num_eval_prompts}, {self.eval_samples_per_prompt})")
        if self.lr <= 0 or self.max_seq_tokens < 64:
            raise ValueError(f"lr={self.lr} must be > 0 and max_seq_tokens={self.max_seq_tokens} >= 64")
        DriverLimits(self.max_turns, self.max_tokens_per_turn, self.max_tokens_per_rollout)  # raises if < 1

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EmbeddedConfig:
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown EmbeddedConfig field(s) {listing(unknown)}")
        tuples = {k: tuple(data[k]) for k in ("hops", "hop_mix", "warmup_hop_mix", "missing_kinds") if k in data}
        return cls(**{**data, **tuples})

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "hops": list(self.hops), "hop_mix": list(self.hop_mix),
                "warmup_hop_mix": list(self.warmup_hop_mix), "missing_kinds": list(self.missing_kinds)}

    def key(self) -> str:
        """16 hex digits naming the cache folder: a hash of the config and BUILD_VERSION. A field added after a
        build version (KEYLESS_DEFAULTS) enters the hash only when it differs from its default, so builds made
        before it keep their names."""
        data = {k: v for k, v in self.to_dict().items() if KEYLESS_DEFAULTS.get(k, object()) != v}
        text = json.dumps({"version": BUILD_VERSION, **data}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def domain_options(self) -> dict[str, Any]:
        """The multihop world's constructor options (plain data: a verl config's `tracerl.domain_options`)."""
        return {"num_entities": self.num_entities, "num_distractors": self.num_distractors, "hops": self.hops,
                "seed": self.domain_seed, "search_k": self.search_k, "hop_mix": self.hop_mix,
                "warmup_hop_mix": self.warmup_hop_mix, "missing_share": self.missing_share,
                "missing_kinds": self.missing_kinds, "unanswerable_share": self.unanswerable_share,
                "warmup_fraction": self.warmup_fraction}

    def make_domain(self) -> MultiHopDomain:
        return MultiHopDomain(**self.domain_options())

    def limits(self) -> DriverLimits:
        return DriverLimits(self.max_turns, self.max_tokens_per_turn, self.max_tokens_per_rollout)
