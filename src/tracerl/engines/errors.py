"""The error every engine raises when generation fails for good: `EngineError`.

It lives here, below the engines that raise it (`openai_engine`, `vllm_engine`, `vllm_worker`), so that none of them
imports another for it. It imports nothing.
"""


class EngineError(ValueError):
    """A request to a generation engine or server failed for good (after retries, or at once for a bad request, a
    malformed answer or an input the engine cannot take). The message names the server or engine and the field."""
