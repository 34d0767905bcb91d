"""Train the tiny target with a plain torch loop and score its greedy answers.

Loss covers the assistant's tokens only (the part the model generates at inference): with thinking
on that is `<think>\\n…\\n</think>\\n\\nanswer<|im_end|>`; with thinking off the empty think block
is part of the prompt (the chat template pre-fills it), so the loss covers the answer alone and the
model never learns to open an empty think block on its own.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from transformers import get_cosine_schedule_with_warmup

from dflashx.tiny.corpus import Example, to_messages

IGNORE = -100


@dataclass
class Encoded:
    ids: list[int]
    labels: list[int]


def prompt_text(tok: Any, messages: list[dict[str, str]], thinking: bool) -> str:
    """The generation prompt for the non-assistant turns of `messages`."""
    return tok.apply_chat_template(
        [m for m in messages if m["role"] != "assistant"],
        tokenize=False, add_generation_prompt=True, enable_thinking=thinking,
    )


def encode(tok: Any, messages: list[dict[str, str]], thinking: bool) -> Encoded:
    """Token ids of prompt + completion, labels masked to the completion (ending at `<|im_end|>`)."""
    prompt = prompt_text(tok, messages, thinking)
    full = tok.apply_chat_template(messages, tokenize=False)
    if not full.startswith(prompt):
        raise ValueError(f"chat template: the generation prompt is not a prefix of the full chat:\n{prompt!r}")
    completion = full[len(prompt):].rstrip("\n")  # ends with <|im_end|>
    p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    c_ids = tok(completion, add_special_tokens=False)["input_ids"]
    return Encoded(p_ids + c_ids, [IGNORE] * len(p_ids) + c_ids)


def encode_corpus(tok: Any, exs: Sequence[Example], seed: int, thinking_off_share: float) -> list[Encoded]:
    """Encode training examples; a seeded `thinking_off_share` of them with thinking off."""
    rng = random.Random(seed)
    out = []
    for ex in exs:
        thinking = rng.random() >= thinking_off_share
        out.append(encode(tok, to_messages(ex, rng, thinking), thinking))
    return out


def _batches(data: list[Encoded], batch_size: int, rng: random.Random, pad_id: int):
    """Endless length-bucketed batches (right padded) as (input_ids, attention_mask, labels)."""
    while True:
        order = list(range(len(data)))
        rng.shuffle(order)
        window = batch_size * 16
        chunks = []
        for start in range(0, len(order), window):
            group = sorted(order[start:start + window], key=lambda i: len(data[i].ids))
            chunks += [group[i:i + batch_size] for i in range(0, len(group), batch_size)]
        rng.shuffle(chunks)
        for chunk in chunks:
            width = max(len(data[i].ids) for i in chunk)
            ids = torch.full((len(chunk), width), pad_id)
            labels = torch.full((len(chunk), width), IGNORE)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, i in enumerate(chunk):
                n = len(data[i].ids)
                ids[row, :n] = torch.tensor(data[i].ids)
                labels[row, :n] = torch.tensor(data[i].labels)
                mask[row, :n] = 1
            yield ids, mask, labels


def train(model: torch.nn.Module, data: list[Encoded], *, steps: int, batch_size: int, lr: float,
          seed: int, pad_id: int, log: Callable[[int, float], None] | None = None) -> dict[str, float]:
    """AdamW with warmup + cosine decay for `steps` steps; returns the final loss and tokens/s."""
    torch.manual_seed(seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    sched = get_cosine_schedule_with_warmup(opt, max(1, steps // 20), steps)
    batches = _batches(data, batch_size, random.Random(seed), pad_id)
    device = next(model.parameters()).device
    tokens, t0, ema = 0, time.perf_counter(), None
    for step in range(1, steps + 1):
        ids, mask, labels = (t.to(device) for t in next(batches))
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        tokens += int(mask.sum())
        ema = loss.item() if ema is None else 0.9 * ema + 0.1 * loss.item()
        if log and (step % 100 == 0 or step == steps):
            log(step, ema)
    model.eval()
    return {"final_loss": round(float(ema or 0.0), 4), "train_tokens": tokens,
            "tokens_per_s": round(tokens / (time.perf_counter() - t0), 1)}


@dataclass
class Reply:
    """A parsed completion: `well_formed` means think block opened and closed, answer present, EOS."""

    reasoning: str
    answer: str
    well_formed: bool


def parse_reply(text: str, thinking: bool) -> Reply:
    """Split generated text (special tokens kept) into reasoning and answer."""
    ended = text.endswith("<|im_end|>")
    body = text.removesuffix("<|im_end|>")
    if not thinking:  # the prompt pre-filled the empty think block
        return Reply("", body.strip(), ended and bool(body.strip()) and "<think>" not in body)
    if not body.startswith("<think>\n") or body.count("</think>") != 1:
        return Reply("", body.strip(), False)
    reasoning, answer = body.removeprefix("<think>\n").split("</think>")
    return Reply(reasoning.strip(), answer.strip(), ended and bool(reasoning.strip()) and bool(answer.strip()))


@torch.no_grad()
def generate(model: Any, tok: Any, prompts: list[str], max_new_tokens: int, batch_size: int = 32) -> list[str]:
    """Greedy completions (special tokens kept) for already-templated prompts, left padded."""
    tok.padding_side = "left"
    out = []
    for start in range(0, len(prompts), batch_size):
        enc = tok(prompts[start:start + batch_size], return_tensors="pt", padding=True,
                  add_special_tokens=False).to(model.device)
        gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        new = gen[:, enc["input_ids"].shape[1]:]
        for row in new:
            text = tok.decode(row, skip_special_tokens=False)
            out.append(text.split(tok.eos_token)[0] + tok.eos_token if tok.eos_token in text
                       else text.replace(tok.pad_token, ""))
    return out


def evaluate(model: Any, tok: Any, exs: Sequence[Example], thinking: bool, max_new_tokens: int,
             seed: int) -> dict[str, Any]:
    """Greedy answers to held-out examples: accuracy and well-formed share, overall and per family."""
    rng = random.Random(seed)
    prompts = [prompt_text(tok, to_messages(ex, rng, thinking), thinking) for ex in exs]
    replies = [parse_reply(t, thinking) for t in generate(model, tok, prompts, max_new_tokens)]
    per: dict[str, list[tuple[bool, bool]]] = defaultdict(list)
    for ex, reply in zip(exs, replies):
        per[ex.family].append((reply.well_formed and reply.answer == ex.answer, reply.well_formed))
    def rates(rows: list[tuple[bool, bool]]) -> dict[str, float]:
        return {"accuracy": round(sum(r[0] for r in rows) / len(rows), 3),
                "well_formed": round(sum(r[1] for r in rows) / len(rows), 3), "n": len(rows)}
    return {"overall": rates([r for rows in per.values() for r in rows]),
            "per_family": {fam: rates(rows) for fam, rows in per.items()}}
