"""Chat rendering: the one place where text becomes token ids (and back).

`ChatRenderer` wraps a Hugging Face tokenizer and its chat template. It renders the opening prompt
(system + tools + user message, then the assistant header), and it renders what the environment
inserts after a policy turn as the exact text the template would put there: the end of the
assistant turn, a tool message (`<tool_response>...</tool_response>` in Qwen3's template) or a user
message, and the next assistant header. It finds those strings once, by rendering a probe
conversation with and without the extra message, so any template that renders a conversation as a
concatenation of its messages works (Qwen3, Qwen2.5, Llama 3.x, Hermes, the embedded tokenizer).

Policy tokens are never re-tokenized: the tree keeps the engine's ids; only inserted text is encoded.
"""

from __future__ import annotations

from typing import Any, Sequence

_MARK = "\u2063OBSERVATION\u2063"  # a probe string no template rewrites


class ChatRenderer:
    def __init__(self, tokenizer: Any, *, end_of_turn: str | None = None):
        self.tokenizer = tokenizer
        vocab = tokenizer.get_vocab()
        self.end_of_turn = end_of_turn or ("<|im_end|>" if "<|im_end|>" in vocab else tokenizer.eos_token)
        if self.end_of_turn not in vocab:
            raise ValueError(f"end-of-turn token {self.end_of_turn!r} is not in the tokenizer's vocabulary; "
                             f"pass end_of_turn= the token your chat template closes an assistant turn with")
        stops = [vocab[self.end_of_turn]] + ([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])
        self.stop_token_ids: tuple[int, ...] = tuple(dict.fromkeys(stops))
        self._between = {role: self._probe(role) for role in ("tool", "user")}

    def _render(self, messages, tools=None, add_generation_prompt=False) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    def _probe(self, role: str) -> tuple[str, str]:
        """(text after the assistant's end-of-turn token up to the message content, text after it)."""
        base = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
        before = self._render(base)
        after = self._render(base + [{"role": role, "content": _MARK}], add_generation_prompt=True)
        cut = before.rfind(self.end_of_turn)
        if cut < 0 or not after.startswith(before[: cut + len(self.end_of_turn)]) or _MARK not in after:
            raise ValueError("the tokenizer's chat template does not render a conversation as a concatenation of its "
                             "messages; tracerl needs that to insert observations without re-tokenizing the policy")
        head, tail = after[cut + len(self.end_of_turn):].split(_MARK, 1)
        return head, tail

    # ------------------------------------------------------------------ encode
    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def prompt_text(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        return self._render(messages, tools, add_generation_prompt=True)

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        return self.encode(self.prompt_text(messages, tools))

    def observation_text(self, observation: str, *, role: str = "tool", turn_closed: bool = True) -> str:
        """What follows a policy turn: [end-of-turn if the policy did not emit it] + message + assistant header."""
        head, tail = self._between[role]
        return ("" if turn_closed else self.end_of_turn) + head + observation + tail

    def policy_text(self, ids: Sequence[int]) -> str:
        """The policy turn as text for the environment, without the end-of-turn token."""
        ids = list(ids)
        while ids and ids[-1] in self.stop_token_ids:
            ids.pop()
        return self.decode(ids)
