"""What every task domain provides, and a base for tool-using environments.

A domain makes prompt rows (verl layout: `data_source`, `prompt` as chat messages,
`reward_model: {"style": "rule", "ground_truth": ...}`, `extra_info`), environments that run them,
and a scripted expert that solves them (for tests and warm starts). `ToolEnv` does the common part of
a turn: parse the action, run a tool or score the final answer, turn every failure into an observation.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from abc import ABC, abstractmethod
from typing import Any, Sequence

import numpy as np

from tracerl.core.history import History

from tracerl.io.env import StepResult
from tracerl.io.env.actions import Tool, call_tool, parse_action
from tracerl.io.files.boundary import listing


class ToolEnv:
    """Subclasses set `self.state` in `reset` and implement `tool_table`, `user_message` and `score`.

    Snapshot/restore deep-copy `self.state`, so everything a continuation must resume belongs there."""

    def __init__(self) -> None:
        self.row: dict[str, Any] = {}
        self.state: dict[str, Any] = {}

    # -- subclass hooks
    def initial_state(self, row: dict[str, Any]) -> dict[str, Any]:
        return {}

    def tool_table(self) -> dict[str, Tool]:
        return {}

    def user_message(self, row: dict[str, Any]) -> str:
        return row["prompt"][-1]["content"]

    def score(self, answer: str) -> float:
        raise NotImplementedError

    # -- Environment protocol
    def reset(self, row: dict[str, Any]) -> str:
        self.row = row
        self.state = self.initial_state(row)
        return self.user_message(row)

    def tools(self) -> list[dict[str, Any]]:
        return [tool.schema() for tool in self.tool_table().values()]

    def step(self, action: str) -> StepResult:
        parsed = parse_action(action)
        if parsed.kind == "answer":
            return StepResult("", True, reward=float(self.score(parsed.answer)), info={"answer": parsed.answer})
        if parsed.kind == "invalid":
            return StepResult(f"error: {parsed.error}", False, tool_error=True, info={"error": "format"})
        observation, failed = call_tool(self.tool_table(), parsed)
        return StepResult(observation, False, tool_error=failed, info={"tool": parsed.name})

    def snapshot(self) -> Any:
        return copy.deepcopy(self.state)

    def restore(self, snapshot: Any) -> None:
        self.state = copy.deepcopy(snapshot)


def make_row(data_source: str, question: str, ground_truth: Any, *, split: str, index: int,
             system: str | None = None, **extra: Any) -> dict[str, Any]:
    """One prompt row in verl's layout."""
    prompt = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    return {"data_source": data_source, "prompt": prompt,
            "reward_model": {"style": "rule", "ground_truth": ground_truth},
            "extra_info": {"split": split, "index": index, **extra}}


class Domain(ABC):
    name: str = ""

    @abstractmethod
    def rows(self, split: str, num: int, seed: int = 0) -> list[dict[str, Any]]:
        """`num` prompt rows of `split` ("train" or "test"); the two splits never share a prompt."""

    @abstractmethod
    def make_env(self) -> ToolEnv:
        """A fresh environment (one per rollout)."""

    @abstractmethod
    def expert_turn(self, row: dict[str, Any], turns: Sequence[tuple[str, str]], rng: np.random.Generator) -> str:
        """The scripted expert's next policy text, given the (action, observation) pairs so far."""

    def with_options(self, **options: Any) -> "Domain":
        """The same domain with some constructor options changed (an embedded build's `warmup_options`: the warm
        start's own question mix). Built-in dataclass domains only."""
        if not dataclasses.is_dataclass(self):
            raise ValueError(f"domain {self.name!r} has no options to change")
        names = {f.name for f in dataclasses.fields(self) if f.init}
        unknown = set(options) - names
        if unknown:
            raise ValueError(f"domain {self.name!r} has no option {listing(unknown)}; its options: {sorted(names)}")
        return dataclasses.replace(self, **options)

    def fingerprint(self) -> str:
        """16 hex digits naming the domain and its options (part of an embedded build's cache key, beside the build
        config's own hash): two domains with the same class and options make the same rows and experts."""
        options = {k: v for k, v in vars(self).items() if not k.startswith("_")}  # private: caches, pools
        text = json.dumps([type(self).__module__, type(self).__qualname__, options], sort_keys=True, default=repr)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def state_features(self, history: History) -> dict[str, float]:
        """Named features of a history's state for the success predictor (`tracerl.core.features`: e.g. hops
        remaining), read from what the policy sees only, never the gold answer; {} = text features only. Whoever
        builds the predictor hands it this hook (`make_predictor(..., state_features=domain.state_features)`)."""
        return {}
