"""In-process backend: batched `model.generate` with transformers (CPU or one GPU).

For the tiny target and tests, and for small targets without a server. Prompts are rendered with
the tokenizer's chat template (tools and `enable_thinking` passed through), left-padded into
batches of `batch_size`, and decoded greedily when `temperature` is 0. The reasoning/answer split
comes from the decoded `<think>...</think>`; usage counts are real token counts (the prompt's
tokens, and the generated tokens up to and including end-of-turn).

The target and its tokenizer load through `dflashx.targets.load` (the one loader), the target in the
resolved `target.load_precision`, as training and evaluation load it; `fp8` needs the converter the generate stage
hands in (`dflashx.dflash.fp8.target_to_fp8`: every decoder layer's linears in FP8, as eval runs it).
"""

from __future__ import annotations

from itertools import islice
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from dflashx.backends.base import Backend, Emit, completion_record, split_think
from dflashx.config.schema import ChatTemplateSpec, GenerateStage
from dflashx.data.chat_mask import THINK_OPEN, render_prompt
from dflashx.targets.load import model_from, tokenizer_from


def _batched(items: Iterable[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    it = iter(items)
    while batch := list(islice(it, size)):
        yield batch


class TransformersBackend(Backend):
    name = "transformers"

    def __init__(
        self,
        model_path: str | Path,
        tokenizer_path: str | Path,
        cfg: GenerateStage,
        chat: ChatTemplateSpec,
        load_precision: str = "fp32",
        device: str | None = None,
        to_fp8: Callable[[Any, Any], Any] | None = None,
    ):
        super().__init__()
        self.model_path = str(model_path)
        self.tokenizer_path = str(tokenizer_path)
        self.cfg = cfg
        self.chat = chat
        if load_precision == "fp8" and to_fp8 is None:
            raise ValueError("target.precision fp8: the transformers backend needs the FP8 converter to run it")
        self.load_precision = load_precision
        self.to_fp8 = to_fp8
        self.device = device
        self.model: Any = None
        self.tokenizer: Any = None

    def __enter__(self) -> "TransformersBackend":
        import torch


        self.device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = tokenizer_from(self.tokenizer_path, padding_side="left")
        self.tokenizer.pad_token = self.tokenizer.pad_token or self.tokenizer.eos_token
        model = model_from(self.model_path, self.load_precision)
        if self.to_fp8 is not None and self.load_precision == "fp8":
            self.to_fp8(model, torch.device(self.device))
        self.model = model.to(self.device).eval()
        return self

    def __exit__(self, *exc: object) -> None:
        self.model = None

    def render(self, prompt: dict[str, Any]) -> str:
        """The prompt as the target sees it: chat template with a generation prompt."""
        return render_prompt(self.tokenizer, prompt, self.chat)

    def generate(self, prompts: Iterable[dict[str, Any]], emit: Emit) -> None:
        for batch in _batched(prompts, self.cfg.batch_size):
            for record in self._generate_batch(batch):
                emit(record)

    def _sampling(self) -> dict[str, Any]:
        if self.cfg.temperature == 0:
            return {"do_sample": False}
        return {"do_sample": True, "temperature": self.cfg.temperature, "top_p": self.cfg.top_p}

    def _generate_batch(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        import torch

        tok = self.tokenizer
        texts = [self.render(p) for p in batch]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        with torch.inference_mode():
            out = self.model.generate(
                **enc,
                max_new_tokens=self.cfg.max_tokens,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
                **self._sampling(),
            )
        new_tokens = out[:, enc["input_ids"].shape[1]:].tolist()
        prompt_lengths = enc["attention_mask"].sum(dim=1).tolist()
        records = []
        for prompt, text, ids, n_prompt in zip(batch, texts, new_tokens, prompt_lengths, strict=True):
            stop = tok.eos_token_id in ids
            ids = ids[: ids.index(tok.eos_token_id) + 1] if stop else ids
            decoded = tok.decode(ids, skip_special_tokens=False).removesuffix(tok.eos_token)
            reasoning, answer = split_think(decoded, opened_in_prompt=text.rstrip().endswith(THINK_OPEN))
            records.append(completion_record(
                prompt,
                reasoning=reasoning,
                answer=answer,
                finish_reason="stop" if stop else "length",
                prompt_tokens=n_prompt,
                completion_tokens=len(ids),
                backend=self.name,
            ))
        return records
