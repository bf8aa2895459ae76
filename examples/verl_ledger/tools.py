"""A verl tool with per-trajectory state, written for verl's tool agent loop and used unchanged by tracerl.

`LedgerTool` records an amount in the trajectory's ledger and says the balance. verl creates, executes and
releases a tool instance per call, so state that must outlive one call lives in the trajectory's
`agent_data.extra_fields`, which verl's `ToolAgentLoop` hands every `execute` of one trajectory (tracerl's driver
hands one per episode, and rebuilds it by replaying the calls when a continuation branches from a turn). The
opening balance comes from the row's `extra_info.tools_kwargs.ledger.create_kwargs`. `execute` returns verl's
triple: the response, a step reward (0.1 when the entry keeps the balance at or above zero, else -0.1) and
metrics.
"""

from typing import Any, Optional
from uuid import uuid4

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse


class LedgerTool(BaseTool):
    """Records an amount in the trajectory's ledger; says the balance."""

    def __init__(self, config: dict, tool_schema):
        super().__init__(config, tool_schema)
        self._instances: dict[str, dict] = {}

    async def create(self, instance_id: Optional[str] = None, **kwargs) -> tuple[str, ToolResponse]:
        instance_id = instance_id or str(uuid4())
        self._instances[instance_id] = {"opening": int(kwargs.get("create_kwargs", {}).get("opening", 0))}
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        agent_data = kwargs["agent_data"]
        ledger = agent_data.extra_fields.setdefault("ledger", [self._instances[instance_id]["opening"]])
        amount = int(parameters["amount"])
        ledger.append(amount)
        balance = sum(ledger)
        text = f"recorded {amount}; balance {balance} after {len(ledger) - 1} entries"
        return ToolResponse(text=text), 0.1 if balance >= 0 else -0.1, {"entries": len(ledger) - 1}

    async def release(self, instance_id: str, **kwargs) -> None:
        del self._instances[instance_id]
