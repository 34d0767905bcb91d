"""A byte-level BPE tokenizer trained locally, wrapped as a transformers fast tokenizer with a
Qwen3-style chat template (`<|im_start|>`, `<|im_end|>`, `<think>`, `</think>`, `enable_thinking`).

Used by the tiny target and by tests that need a real tokenizer without downloads. Digits are split
one per token (as Qwen3 does), so the tiny target can learn column arithmetic. The template is
ours, written to render the same token layout as the Qwen3 family: the final assistant turn is
`<think>\\n{reasoning}\\n</think>\\n\\n{answer}<|im_end|>`, and a generation prompt with thinking off
pre-fills an empty think block.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|mask|>"]
MASK_TOKEN = "<|mask|>"

CHAT_TEMPLATE = (
    "{% if tools %}"
    "<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n<tools>\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools><|im_end|>\n"
    "{% elif messages[0].role == 'system' %}"
    "<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'system' %}"
    "{% elif message.role == 'assistant' %}"
    "<|im_start|>assistant\n"
    "{% set reasoning = message.reasoning_content if message.reasoning_content is defined and "
    "message.reasoning_content is not none else '' %}"
    "{% if loop.last or reasoning %}"
    "<think>\n{{ reasoning | trim }}\n</think>\n\n"
    "{% endif %}"
    "{{ message.content }}<|im_end|>\n"
    "{% else %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2048, out_dir: str | Path | None = None):
    """Train a byte-level BPE on `texts`; return a `PreTrainedTokenizerFast` (saved if `out_dir`)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # Digits one token each, as in the Qwen3 tokenizer: arithmetic stays digit-aligned.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=[MASK_TOKEN],
    )
    fast.chat_template = CHAT_TEMPLATE
    if out_dir is not None:
        fast.save_pretrained(str(out_dir))
    return fast
