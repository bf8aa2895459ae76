"""A small byte-level BPE tokenizer trained on task text, with a Qwen3-style chat template.

Used by the embedded tiny policy and by tests: it is trained offline with Hugging Face `tokenizers`
and wrapped as a `transformers.PreTrainedTokenizerFast`, so the rollout driver uses it exactly as it
would use a downloaded Qwen3 tokenizer. Tool calls, tool responses and answers are special tokens,
so the tiny policy emits each as one id. Loading a real tokenizer from the hub or a local path is
`transformers.AutoTokenizer.from_pretrained`, not this module.
"""

from __future__ import annotations

from typing import Iterable

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
                  "<tool_response>", "</tool_response>", "<answer>", "</answer>", "<think>", "</think>"]

# Qwen3's layout, with the tool list shortened to names and parameters (a tiny model pays for every prompt
# token). transformers renders templates with trim_blocks, so a newline right after a tag is written {{ '\\n' }}.
CHAT_TEMPLATE = (
    "{% if tools or messages[0].role == 'system' %}"
    "<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}{% endif %}"
    "{% if tools %}{{ '\\n' }}tools:{% for tool in tools %} {{ tool.function.name }}("
    "{{ tool.function.parameters.properties.keys() | join(', ') }}){% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response><|im_end|>\n"
    "{% elif message.role != 'system' %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 1024, min_frequency: int = 2, split_digits: bool = False):
    """Train a byte-level BPE on `texts`; returns a PreTrainedTokenizerFast with the chat template above.

    split_digits=True gives every digit its own token (no merge crosses a digit): a number is then copied digit by
    digit, one pattern for all numbers, where merged digits would make each multi-digit chunk a word of its own
    that a tiny model must learn to copy separately. Tasks that copy numbers (math, amounts) need it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < len(SPECIAL_TOKENS) + 256:
        raise ValueError(f"vocab_size={vocab_size} cannot hold the 256 byte tokens and {len(SPECIAL_TOKENS)} "
                         f"special tokens; use at least {len(SPECIAL_TOKENS) + 256}")
    core = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                          if split_digits else byte_level)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    core.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None, chat_template=CHAT_TEMPLATE,
                                   additional_special_tokens=SPECIAL_TOKENS[3:])
