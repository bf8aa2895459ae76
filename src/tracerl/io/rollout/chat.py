"""Chat rendering: the one place where text becomes token ids (and back).

`ChatRenderer` wraps a Hugging Face tokenizer and its chat template. It renders the opening prompt
(system + tools + user message, then the assistant header), and it renders what the environment
inserts after a policy turn as the exact text the template would put there: the end of the
assistant turn, a tool message (`<tool_response>...</tool_response>` in Qwen3's template) or a user
message, and the next assistant header. It finds those strings once, by rendering a probe
conversation with and without the extra message, so any template that renders a conversation as a
concatenation of its messages works (Qwen3, Qwen2.5, Llama 3.x, Hermes, the embedded tokenizer).

Policy tokens are never re-tokenized: the tree keeps the engine's ids; only inserted text is encoded.

Text the project inserts cannot forge the chat template: `neutralise` is the one function every such text goes
through before it is encoded. It puts a zero-width space after the first character of every added or special
token of the tokenizer (`<|im_end|>`, `<|im_start|>`, `<tool_call>`, ...) written in the text, so it is encoded as
plain text, never as the control token, and replaces lone surrogates (a JSON "\\ud800") with "?". `prompt_text`
applies it to every message of a prompt (a data row's system messages and question) and every string of the tool
schemas; the driver applies it to every observation (`tracerl.io.rollout.driver`).
"""

from __future__ import annotations

import re
from typing import Any, Sequence

_MARK = "\u2063OBSERVATION\u2063"  # a probe string no template rewrites
_BREAK = "\u200b"  # zero-width space: splits a control token's text so the tokenizer cannot match it


def special_token_pattern(tokenizer: Any) -> re.Pattern[str] | None:
    """A regex matching the text of every added or special token of `tokenizer` (longest first), or None."""
    try:
        tokens = set(tokenizer.get_added_vocab())
    except AttributeError:
        tokens = set()
    tokens |= set(getattr(tokenizer, "all_special_tokens", ()) or ())
    tokens = {t for t in tokens if isinstance(t, str) and len(t) > 1}
    if not tokens:
        return None
    return re.compile("|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True)))


def neutralise(text: str, pattern: re.Pattern[str] | None) -> tuple[str, int]:
    """`text` safe to encode as plain text: lone surrogates become "?", and each match of `pattern` is split
    after its first character by a zero-width space; (text, number of matches split)."""
    text = text.encode("utf-8", "replace").decode("utf-8")
    if pattern is None:
        return text, 0
    return pattern.subn(lambda m: m.group(0)[0] + _BREAK + m.group(0)[1:], text)


MAX_DEPTH = 100  # levels of lists and objects `_neutralise_all` walks (tool schemas are checked at load to 64)


def _neutralise_all(value: Any, pattern: re.Pattern[str] | None, depth: int = 0) -> Any:
    """`value` (JSON-like: a tool schema) with `neutralise` applied to every string in it, keys included; a value
    nesting deeper than `MAX_DEPTH` is a ValueError, never a RecursionError."""
    if isinstance(value, str):
        return neutralise(value, pattern)[0]
    if isinstance(value, (dict, list, tuple)) and depth >= MAX_DEPTH:
        raise ValueError(f"a tool schema or message nests deeper than {MAX_DEPTH} levels of lists and objects")
    if isinstance(value, dict):
        return {_neutralise_all(k, pattern, depth + 1): _neutralise_all(v, pattern, depth + 1)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_neutralise_all(v, pattern, depth + 1) for v in value]
    return value


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
        self.specials = special_token_pattern(tokenizer)  # what `neutralise` splits in inserted text
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
        """The opening prompt, every message's content and every string of the tool schemas neutralised."""
        messages = [{**m, "content": _neutralise_all(m["content"], self.specials)} for m in messages]
        return self._render(messages, _neutralise_all(tools, self.specials), add_generation_prompt=True)

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
