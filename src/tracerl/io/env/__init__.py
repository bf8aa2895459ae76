"""Environment protocol: text in, text out, a binary verifiable reward at the end.

An environment is created per rollout by a domain. `reset(row)` starts it on one prompt row (verl
layout: `data_source`, `prompt`, `reward_model.ground_truth`, `extra_info`) and returns the first
user message; `step(action)` takes the policy's text for one turn and returns what the environment
inserts next. `snapshot()`/`restore()` let a continuation resume the exact state of a prefix.

Bad model output is data, never an exception: an unparseable tool call, an unknown tool, wrong
arguments, a tool that raises or times out all come back as an observation with `tool_error=True`.

The environments' room: beside the protocol, tool calls (`actions`), the one runner for a user's code (`user_code`),
rewards in a pool (`rewards`) and a user's own task (`task`, `task_tools`; `verl_task` reads verl's tool and reward
files into one). The built-in domains are a room of their own, above this one (`tracerl.io.domains`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


class EpisodeError(RuntimeError):
    """Raised by an environment that cannot finish the episode through no fault of the model's turn (a user's reward
    function that raised or returned a non-number): the driver ends the rollout as a failed leaf and counts it,
    where any other exception from `step` becomes an error observation the model sees."""


@dataclass
class StepResult:
    observation: str  # text the environment inserts after the policy's turn ("" when done)
    done: bool  # the episode ended (final answer, or a fatal error)
    reward: float = 0.0  # outcome reward in {0, 1}; meaningful when done
    tool_error: bool = False  # the turn's tool call failed (counted in metrics, shown to the model)
    info: dict[str, Any] = field(default_factory=dict)


class Environment(Protocol):
    def reset(self, row: dict[str, Any]) -> str:
        """Start an episode on `row`; returns the user message that opens the conversation."""

    def tools(self) -> list[dict[str, Any]]:
        """JSON schemas of the tools (OpenAI function format) for the chat template's system prompt."""

    def step(self, action: str) -> StepResult:
        """Apply one policy turn (thought + tool call or final answer)."""

    def snapshot(self) -> Any:
        """An opaque copy of the state, enough for `restore` to resume exactly here."""

    def restore(self, snapshot: Any) -> None:
        ...
