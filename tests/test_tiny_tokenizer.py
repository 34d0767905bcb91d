"""The tiny tokenizer on the tiny corpus: round trips, digits, chat template in both thinking modes."""

from __future__ import annotations

import random

import pytest

from dflashx.tiny import corpus, train
from dflashx.tiny.build import MASK_TOKEN_ID, _tokenizer_texts
from dflashx.tiny.tokenizer import MASK_TOKEN, train_tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    exs = corpus.examples("train", 1500, 0)
    return train_tokenizer(_tokenizer_texts(exs, 0), 1024, tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def chats():
    rng = random.Random(1)
    return [corpus.to_messages(ex, rng, thinking=i % 3 != 0) for i, ex in enumerate(corpus.examples("eval", 60, 0))]


def test_round_trip_of_rendered_chats(tok, chats):
    for messages in chats:
        text = tok.apply_chat_template(messages, tokenize=False)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text


def test_special_tokens_and_mask_token(tok, chats):
    assert tok.convert_tokens_to_ids(MASK_TOKEN) == MASK_TOKEN_ID
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    for text in ("<|im_start|>", "<think>", "</think>", MASK_TOKEN):
        assert len(tok(text, add_special_tokens=False)["input_ids"]) == 1
    for messages in chats:
        assert MASK_TOKEN_ID not in train.encode(tok, messages, True).ids


def test_digits_are_single_tokens(tok):
    ids = tok("12345 + 678", add_special_tokens=False)["input_ids"]
    digit_pieces = [p for p in (tok.decode([i]) for i in ids) if any(c.isdigit() for c in p)]
    assert digit_pieces == list("12345678")


def _decode_completion(tok, enc: train.Encoded) -> str:
    return tok.decode([i for i, lab in zip(enc.ids, enc.labels) if lab != train.IGNORE])


def test_thinking_on_completion_opens_and_closes_the_think_block(tok, chats):
    messages = chats[1]
    prompt = train.prompt_text(tok, messages, thinking=True)
    assert prompt.endswith("<|im_start|>assistant\n") and "<think>" not in prompt
    enc = train.encode(tok, messages, thinking=True)
    completion = _decode_completion(tok, enc)
    reasoning = messages[-1]["reasoning_content"]
    assert completion == f"<think>\n{reasoning}\n</think>\n\n{messages[-1]['content']}<|im_end|>"
    think_open, think_close = tok.convert_tokens_to_ids(["<think>", "</think>"])
    labelled = [lab for lab in enc.labels if lab != train.IGNORE]
    assert labelled[0] == think_open and labelled.count(think_close) == 1
    assert labelled[-1] == tok.eos_token_id


def test_thinking_off_prefills_an_empty_think_block_outside_the_loss(tok, chats):
    messages = chats[0]
    assert messages[-1]["reasoning_content"] == ""
    prompt = train.prompt_text(tok, messages, thinking=False)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    enc = train.encode(tok, messages, thinking=False)
    think_open, think_close = tok.convert_tokens_to_ids(["<think>", "</think>"])
    prompt_ids = [i for i, lab in zip(enc.ids, enc.labels) if lab == train.IGNORE]
    assert think_open in prompt_ids and think_close in prompt_ids
    assert _decode_completion(tok, enc) == messages[-1]["content"] + "<|im_end|>"


@pytest.mark.parametrize(("text", "thinking", "ok", "answer"), [
    ("<think>\nsteps\n</think>\n\nThe answer.<|im_end|>", True, True, "The answer."),
    ("<think>\nsteps\n</think>\n\nThe answer.", True, False, "The answer."),  # no EOS: truncated
    ("<think>\nsteps and more steps", True, False, "<think>\nsteps and more steps"),  # never closed
    ("<think>\n\n</think>\n\nThe answer.<|im_end|>", True, False, "The answer."),  # empty reasoning
    ("<think>\nsteps\n</think>\n\n<|im_end|>", True, False, ""),  # no answer
    ("The answer.<|im_end|>", False, True, "The answer."),
    ("<think>\nx\n</think>\n\nThe answer.<|im_end|>", False, False, "<think>\nx\n</think>\n\nThe answer."),
])
def test_parse_reply(text, thinking, ok, answer):
    reply = train.parse_reply(text, thinking)
    assert reply.well_formed is ok
    assert reply.answer == answer
