"""The vault tool: a verl `BaseTool` whose instances keep per-trajectory state (the row's owner) in the tool."""

from typing import Any, Optional
from uuid import uuid4

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse


class VaultTool(BaseTool):
    """Looks a vault's code up in `config.codes`; the caller's name comes from the row's `create_kwargs`."""

    def __init__(self, config: dict, tool_schema):
        super().__init__(config, tool_schema)
        self.codes = dict(config["codes"])
        self._instances: dict[str, dict] = {}

    async def create(self, instance_id: Optional[str] = None, **kwargs) -> tuple[str, ToolResponse]:
        instance_id = instance_id or str(uuid4())
        self._instances[instance_id] = {"owner": kwargs.get("create_kwargs", {}).get("owner", "nobody")}
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        name = str(parameters.get("name", "")).lower()
        if name not in self.codes:
            return ToolResponse(text=f"no vault named {name!r}"), 0.0, {}
        owner = self._instances[instance_id]["owner"]
        return ToolResponse(text=f"vault {name} opened for {owner}: code {self.codes[name]}"), 0.0, {}

    async def release(self, instance_id: str, **kwargs) -> None:
        del self._instances[instance_id]
