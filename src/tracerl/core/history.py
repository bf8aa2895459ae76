"""What the success predictor reads: a prefix history (bare prompt or prompt + turns so far).

Kept apart from the tree so that a trainer embedding tracerl can build histories from its own
transcripts and use the predictor without our tree type.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class History:
    text: str  # the serialized prefix: prompt, then each turn's policy text and observation
    depth: int = 0  # turns taken so far (0 = bare prompt)
    num_tool_errors: int = 0  # turns whose observation reported a tool or format error
    num_tokens: int = 0  # tokens generated or inserted after the prompt
    prompt_id: str = ""
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)  # e.g. a simulator's true p
