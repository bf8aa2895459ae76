"""A verl function tool (`actor_rollout_ref.rollout.multi_turn.function_tool_path`): stateless, its schema derived by
verl from the signature and docstring."""

from verl.tools.function_tool import function_tool


@function_tool
def fee(amount: int, express: bool = False) -> str:
    """The bank's fee for recording an amount.

    Args:
        amount: the amount to record
        express: whether the entry is recorded the same day
    """
    return f"fee {1 + abs(amount) // 100 + (2 if express else 0)}"
