"""Prompt rows checked at load: verl's layout, with message shapes and types by allowlist.

A row is a JSON object: `data_source` (text or null), `prompt` (a list of chat messages, or a string: the user's
question), `reward_model` (an object with `ground_truth`, any JSON value, since the reward reads it) and
`extra_info` (an object or null). A message is exactly `{"role", "content"}`: the role one of `ROLES`, the content
a string or a list of OpenAI text parts `[{"type": "text", "text": ...}]`, joined by newlines (as vLLM's chat
utilities join text parts). The last message is the user's, and its text is not blank. A key whose value is null
counts as absent (parquet gives every struct of a column the union of their keys, the missing ones null). Anything
else is refused with a `ValueError` naming the row and the field (`data/train.jsonl row 3: prompt[0].content is
null; ...`), so no row trains on an empty question or on the Python repr of a value.

Deliberately not here: what the text says (control tokens written in it are neutralised when the prompt is
rendered, by the function that neutralises tool observations: `tracerl.io.chat.neutralise`), images and other
non-text content parts, tool calls and tool messages inside a prompt.
"""

from __future__ import annotations

from typing import Any

ROLES = ("system", "user", "assistant")
MESSAGE = "{'role': 'user', 'content': '...'}"


def _kind(value: Any) -> str:
    """What a JSON value is, for a message: 'null', 'a number (5)', 'a list ([1])', ..."""
    if value is None:
        return "null"
    kind = ("a boolean" if isinstance(value, bool) else "a number" if isinstance(value, (int, float))
            else "a string" if isinstance(value, str) else "a list" if isinstance(value, list)
            else "an object" if isinstance(value, dict) else f"a {type(value).__name__}")
    return f"{kind} ({value!r:.40})"


def _present(fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` without the keys whose value is null."""
    return {k: v for k, v in fields.items() if v is not None}


def _content(content: Any, where: str) -> str:
    """A message's content as text: a string, or OpenAI text parts joined by newlines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise ValueError(f"{where} is {_kind(content)}; write the text as a string (or a list of OpenAI text parts "
                         "[{'type': 'text', 'text': '...'}])")
    texts = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        if not isinstance(part, dict):
            raise ValueError(f"{at} is {_kind(part)}; a content part is {{'type': 'text', 'text': '...'}}")
        part = _present(part)
        if part.get("type") != "text":
            raise ValueError(f"{at}.type is {_kind(part.get('type'))}; only text parts are supported "
                             "({'type': 'text', 'text': '...'}): images and other parts cannot be trained on here")
        if not isinstance(part.get("text"), str):
            raise ValueError(f"{at}.text is {_kind(part.get('text'))}; write the text as a string")
        extra = sorted(set(part) - {"type", "text"})
        if extra:
            raise ValueError(f"{at} has key(s) {extra}; a text part holds only 'type' and 'text'")
        texts.append(part["text"])
    return "\n".join(texts)


def check_prompt(prompt: Any, where: str) -> list[dict[str, str]]:
    """`prompt` as a list of {"role", "content": str} ending with the user's non-blank question; ValueError naming
    `where` and the field otherwise."""
    head = f"{where} has no usable 'prompt':"
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if not isinstance(prompt, list) or not prompt:
        raise ValueError(f"{head} prompt is {_kind(prompt)}; write a list of chat messages [{MESSAGE}] ending "
                         "with the user's, or the question as a string")
    messages = []
    for i, message in enumerate(prompt):
        at = f"{head} prompt[{i}]"
        if not isinstance(message, dict):
            raise ValueError(f"{at} is {_kind(message)}, not a message {MESSAGE}")
        message = {"role": None, "content": None, **_present(message)}  # a missing one is named as null below
        extra = sorted(set(message) - {"role", "content"})
        if extra:
            raise ValueError(f"{at} has key(s) {extra}; a message holds only 'role' and 'content'")
        role = message["role"]
        if not isinstance(role, str) or role not in ROLES:
            raise ValueError(f"{at}.role is {_kind(role)}; use one of {', '.join(ROLES)}")
        messages.append({"role": role, "content": _content(message["content"], f"{at}.content")})
    last = len(messages) - 1
    if messages[last]["role"] != "user":
        raise ValueError(f"{head} prompt[{last}] is the {messages[last]['role']}'s; a prompt ends with the user's "
                         "message, the question the model answers")
    if not messages[last]["content"].strip():
        raise ValueError(f"{head} prompt[{last}].content is blank; the user's message is the question the model "
                         "answers")
    return messages


def check_row(row: Any, where: str) -> dict[str, Any]:
    """`row` checked field by field, with its prompt normalised by `check_prompt`; ValueError naming `where` (the
    file and row) and the field."""
    if not isinstance(row, dict):
        raise ValueError(f"{where} is {_kind(row)}, not an object with data_source, prompt, reward_model, "
                         "extra_info")
    data_source = row.get("data_source")
    if data_source is not None and not isinstance(data_source, str):
        raise ValueError(f"{where}: data_source is {_kind(data_source)}; write a string (it names the dataset the "
                         "reward scores by)")
    prompt = check_prompt(row.get("prompt"), where)
    reward_model = row.get("reward_model")
    if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
        raise ValueError(f"{where} has no 'reward_model.ground_truth'; add "
                         "\"reward_model\": {\"style\": \"rule\", \"ground_truth\": ...}")
    extra_info = row.get("extra_info")
    if extra_info is not None and not isinstance(extra_info, dict):
        raise ValueError(f"{where}: extra_info is {_kind(extra_info)}; write an object (or leave it out)")
    return {**row, "prompt": prompt}
