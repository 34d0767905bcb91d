"""Token-level loss-mask tests: thinking on/off, multi-turn, tools, and the slow reference."""

from __future__ import annotations

import random

import numpy as np
import pytest

from dflashx.data.chat_mask import ChatMasker, ChatTemplateError, completion_messages, split_think
from helpers_tokenizer import random_conversation, tokenizer_dir


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return tokenizer_dir(str(tmp_path_factory.mktemp("tok")))


@pytest.fixture(scope="module")
def on(tok_dir):
    return ChatMasker.from_path(tok_dir, enable_thinking=True)


@pytest.fixture(scope="module")
def off(tok_dir):
    return ChatMasker.from_path(tok_dir, enable_thinking=False)


def encode_ids(masker: ChatMasker, text: str) -> list[int]:
    return masker.backend.encode(text, add_special_tokens=False).ids


def runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, stop) of each contiguous run of ones."""
    edges = np.diff(np.concatenate([[0], mask.astype(int), [0]]))
    return list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)))


def masked_texts(masker: ChatMasker, enc) -> list[str]:
    return [masker.tokenizer.decode(enc.input_ids[a:b]) for a, b in runs(enc.loss_mask)]


CONV = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "It is 4.", "reasoning_content": "two plus two is four"},
]


def test_thinking_on_masks_reasoning_answer_and_end_of_turn_only(on):
    enc = on.encode_conversations([(CONV, None)])[0]
    ids = np.asarray(enc.input_ids)
    prompt = on.tokenizer.apply_chat_template(CONV[:-1], tokenize=False, add_generation_prompt=True,
                                              enable_thinking=True)
    assert prompt.endswith("<|im_start|>assistant\n")
    prompt_ids = encode_ids(on, prompt)
    expected = encode_ids(on, "<think>\ntwo plus two is four\n</think>\n\nIt is 4.<|im_end|>")
    # prompt (system, user, assistant header) unmasked, then exactly the generated tokens, then "\n"
    assert ids[: len(prompt_ids)].tolist() == prompt_ids
    assert not enc.loss_mask[: len(prompt_ids)].any()
    assert ids[enc.loss_mask == 1].tolist() == expected
    assert runs(enc.loss_mask) == [(len(prompt_ids), len(prompt_ids) + len(expected))]
    assert on.tokenizer.decode(ids[len(prompt_ids) + len(expected):]) == "\n"


def test_empty_reasoning_with_thinking_on_is_the_seed_shape(on):
    conv = [*CONV[:-1], {"role": "assistant", "content": "OK.", "reasoning_content": ""}]
    enc = on.encode_conversations([(conv, None)])[0]
    assert masked_texts(on, enc) == ["<think>\n\n</think>\n\nOK.<|im_end|>"]


def test_thinking_off_leaves_the_prefilled_think_block_in_the_prompt(off):
    conv = [*CONV[:-1], {"role": "assistant", "content": "OK.", "reasoning_content": ""}]
    enc = off.encode_conversations([(conv, None)])[0]
    assert masked_texts(off, enc) == ["OK.<|im_end|>"]
    first = runs(enc.loss_mask)[0][0]
    assert off.tokenizer.decode(enc.input_ids[:first]).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


@pytest.mark.parametrize("thinking", [True, False])
def test_multi_turn_masks_every_assistant_turn(tok_dir, thinking):
    """Thinking on: generated turns carry reasoning; off: none do (what a thinking-off target writes)."""
    masker = ChatMasker.from_path(tok_dir, enable_thinking=thinking)
    thought = (lambda t: t) if thinking else (lambda t: "")
    conv = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "first answer"},  # context turn from the source: no reasoning
        {"role": "user", "content": "second question"},
        {"role": "assistant", "content": "second answer", "reasoning_content": thought("some thought")},
        {"role": "user", "content": "third question"},
        {"role": "assistant", "content": "third answer", "reasoning_content": thought("last thought")},
    ]
    enc = masker.encode_conversations([(conv, None)])[0]
    if thinking:
        expected = ["first answer<|im_end|>", "<think>\nsome thought\n</think>\n\nsecond answer<|im_end|>",
                    "<think>\nlast thought\n</think>\n\nthird answer<|im_end|>"]
    else:
        expected = ["first answer<|im_end|>", "second answer<|im_end|>", "third answer<|im_end|>"]
    assert masked_texts(masker, enc) == expected
    unmasked = masker.tokenizer.decode([i for i, m in zip(enc.input_ids, enc.loss_mask) if not m])
    for text in ("sys", "first question", "second question", "third question"):
        assert text in unmasked
    assert unmasked.count("<|im_start|>assistant\n") == 3


def test_tools_are_prompt_not_loss(on):
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    enc = on.encode_conversations([(CONV, tools)])[0]
    text = on.tokenizer.decode(enc.input_ids)
    assert '"name": "add"' in text
    assert masked_texts(on, enc) == ["<think>\ntwo plus two is four\n</think>\n\nIt is 4.<|im_end|>"]


def slow_reference_mask(masker: ChatMasker, messages: list[dict]) -> tuple[list[int], np.ndarray]:
    """The usual per-sample way: apply_chat_template on each prefix (with generation prompt) and
    up to each assistant turn; the tokens in between are that turn's output."""
    tok, kw = masker.tokenizer, masker.kwargs
    whole = tok.apply_chat_template(messages, tokenize=True, return_dict=False, **kw)
    mask = np.zeros(len(whole), dtype=np.uint8)
    eot = tok.convert_tokens_to_ids(tok.eos_token)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prompt = tok.apply_chat_template(messages[:i], tokenize=True, return_dict=False,
                                         add_generation_prompt=True, **kw)
        upto = tok.apply_chat_template(messages[: i + 1], tokenize=True, return_dict=False, **kw)
        assert whole[: len(upto) - 1] == upto[:-1] and whole[: len(prompt)] == prompt
        stop = len(upto) - upto[::-1].index(eot)
        mask[len(prompt):stop] = 1
    return whole, mask


def test_mask_matches_the_slow_reference_on_random_samples(on):
    rng = random.Random(7)
    convs = [random_conversation(rng, turns=rng.randint(1, 3), system=rng.random() < 0.5) for _ in range(150)]
    encoded = on.encode_conversations([(c, None) for c in convs])
    for conv, enc in zip(convs, encoded):
        ids, mask = slow_reference_mask(on, conv)
        assert enc.input_ids == ids
        np.testing.assert_array_equal(enc.loss_mask, mask)


def test_completion_record_becomes_a_conversation(on):
    record = {"messages": CONV[:-1], "reasoning": "two plus two is four", "answer": "It is 4."}
    enc = on.encode_conversations([(completion_messages(record), None)])[0]
    assert masked_texts(on, enc) == ["<think>\ntwo plus two is four\n</think>\n\nIt is 4.<|im_end|>"]


def test_missing_end_of_turn_is_a_clear_error(tok_dir):
    masker = ChatMasker.from_path(tok_dir, end_of_turn="<|never|>")
    with pytest.raises(ChatTemplateError, match="end-of-turn marker '<\\|never\\|>' not found"):
        masker.render(CONV)


@pytest.mark.parametrize("content, expected", [
    ("<think>r</think>a", ("r", "a", True)),
    ("r</think>a", ("r", "a", True)),
    ("just an answer", ("", "just an answer", True)),
    ("<think>never closed", ("never closed", "", False)),
    ("x<think>r</think>a", ("r", "a", False)),
    ("<think>r</think>a<think>", ("r", "a<think>", False)),
])
def test_split_think(content, expected):
    assert split_think(content) == expected
