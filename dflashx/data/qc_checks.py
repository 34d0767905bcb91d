"""The QC gate's checks: stream samples once, keep compact statistics, judge them against thresholds.

Each check yields a plain-words verdict with the likely cause, so a failed gate says what to fix
("responses are empty: thinking seems off — check target.chat_template.enable_thinking").
Loss-mask sizes are exact tokens when a tokenizer is given (or the input is tokenized); otherwise
they are whitespace-separated words of reasoning + answer, and the result says so.
"""

from __future__ import annotations

import hashlib
import re
from array import array
from collections import Counter
from dataclasses import asdict, dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, Iterable, Iterator

from dflashx.config.schema import QCThresholds
from dflashx.data.jsonl import count_records
from dflashx.data.qc_inputs import QCSample, is_tokenized_dataset, iter_samples

THINKING_OFF = "thinking seems off — check target.chat_template.enable_thinking"
REPEAT_MAX_WORDS = 16  # answers up to this many words take part in the repeated-answer check
EXAMPLES = 5


def words(text: str | None) -> int:
    return len(text.split()) if text else 0


def _normalise(answer: str) -> str:
    return re.sub(r"\s+", " ", answer.strip().lower())


@dataclass
class Check:
    """One check's outcome. `value` and `limit` are fractions of the samples it was measured on."""

    name: str
    passed: bool
    value: float | None
    limit: float
    measured_on: int
    detail: str
    cause: str = ""
    skipped: str = ""
    examples: list[str] = field(default_factory=list)

    def line(self) -> str:
        text = f"{self.name}: {self.detail} (limit {self.limit:.1%})"
        return f"{text} — {self.cause}" if self.cause and not self.passed else text


UNKNOWN_SOURCE = "unknown"  # the label of samples whose record names no source


@dataclass
class SourceStats:
    """One source's share of the data: samples, loss tokens (or words) and truncations."""

    samples: int = 0
    loss_measured: int = 0  # samples whose loss-mask size is known (all, or the measured spread)
    loss_size: int = 0  # their loss-mask sizes summed, in QCStats.unit
    finish_known: int = 0
    truncated: int = 0
    rejected: int = 0


@dataclass
class QCStats:
    """Compact per-sample statistics (numbers and hashes, never the texts)."""

    unit: str = "words"
    n: int = 0
    reasoning_known: int = 0
    empty_examples: list[str] = field(default_factory=list)
    empty_reasoning_count: int = 0
    short_answers: int = 0
    short_examples: list[str] = field(default_factory=list)
    answers: Counter = field(default_factory=Counter)
    finish_known: int = 0
    truncated: int = 0
    truncated_examples: list[str] = field(default_factory=list)
    think_known: int = 0
    unbalanced: int = 0
    unbalanced_examples: list[str] = field(default_factory=list)
    seen: set[bytes] = field(default_factory=set)
    duplicates: int = 0
    duplicate_examples: list[str] = field(default_factory=list)
    mask_sizes: array = field(default_factory=lambda: array("l"))
    answer_words: array = field(default_factory=lambda: array("l"))
    reasoning_words: array = field(default_factory=lambda: array("l"))
    min_answer_words: int = 2
    sources: dict[str, SourceStats] = field(default_factory=dict)
    rejected: int = 0
    rejected_examples: list[str] = field(default_factory=list)

    def add(self, s: QCSample) -> None:
        self.n += 1
        src = self.sources.setdefault(s.source or UNKNOWN_SOURCE, SourceStats())
        src.samples += 1
        if s.error:  # refused by the server: no response to judge (tokenize drops it too)
            self.rejected += 1
            src.rejected += 1
            _note(self.rejected_examples, s.id)
            return
        if s.reasoning is not None:
            self.reasoning_known += 1
            self.reasoning_words.append(words(s.reasoning))
            if not s.reasoning.strip():
                self.empty_reasoning_count += 1
                _note(self.empty_examples, s.id)
        if s.answer is not None:
            n_words = words(s.answer)
            self.answer_words.append(n_words)
            if n_words < self.min_answer_words:
                self.short_answers += 1
                _note(self.short_examples, s.id)
            if n_words <= REPEAT_MAX_WORDS:
                self.answers[_normalise(s.answer)] += 1
            digest = hashlib.blake2b(f"{s.reasoning}\x00{s.answer}".encode(), digest_size=12).digest()
            if digest in self.seen:
                self.duplicates += 1
                _note(self.duplicate_examples, s.id)
            self.seen.add(digest)
        if s.finish_reason is not None:
            self.finish_known += 1
            src.finish_known += 1
            if s.finish_reason == "length":
                self.truncated += 1
                src.truncated += 1
                _note(self.truncated_examples, s.id)
        if s.think_balanced is not None:
            self.think_known += 1
            if not s.think_balanced:
                self.unbalanced += 1
                _note(self.unbalanced_examples, s.id)
        size = s.mask_size
        if size is None and self.unit == "words" and s.reasoning is not None and s.answer is not None:
            size = words(s.reasoning) + words(s.answer)
        if size is not None:
            self.mask_sizes.append(size)
            src.loss_measured += 1
            src.loss_size += size

    def per_source(self) -> dict[str, dict[str, Any]]:
        """Each source's samples, share of samples, loss size (in `unit`) and its share, and
        truncations (count, and share of the source's samples with a finish_reason); sorted by name."""
        loss_total = sum(s.loss_size for s in self.sources.values())
        return {name: {"samples": s.samples, "share": s.samples / self.n if self.n else 0.0,
                       f"loss_{self.unit}": s.loss_size, "loss_measured": s.loss_measured,
                       "loss_share": s.loss_size / loss_total if loss_total else None,
                       "truncated": s.truncated, "rejected": s.rejected,
                       "truncated_frac": s.truncated / s.finish_known if s.finish_known else None}
                for name, s in sorted(self.sources.items())}


def _note(examples: list[str], sample_id: str) -> None:
    if len(examples) < EXAMPLES:
        examples.append(sample_id)


def _frac_check(name: str, count: int, total: int, limit: float, what: str, cause: str,
                examples: list[str], skipped: str = "") -> Check:
    if skipped or total == 0:
        return Check(name, True, None, limit, total, f"not checked: {skipped or 'no data for it'}",
                     skipped=skipped or "no data for it")
    value = count / total
    return Check(name, value <= limit, value, limit, total,
                 f"{value:.1%} of {total} samples {what}", cause, examples=examples)


def evaluate(stats: QCStats, t: QCThresholds, enable_thinking: bool = True) -> list[Check]:
    """Judge the statistics against the thresholds: one Check per test, in a fixed order."""
    checks = [
        _frac_check("empty_reasoning", stats.empty_reasoning_count, stats.reasoning_known,
                    t.max_empty_reasoning_frac, "have empty reasoning although thinking was requested",
                    f"responses are empty: {THINKING_OFF} (and that the server splits reasoning, "
                    "e.g. SGLang --reasoning-parser qwen3)", stats.empty_examples,
                    skipped="" if enable_thinking else "thinking was not requested"),
        _frac_check("short_answers", stats.short_answers, len(stats.answer_words), t.max_short_answer_frac,
                    f"answer in fewer than {t.min_answer_words} words",
                    f"answers are a word or two: {THINKING_OFF}, or the prompts/template are broken",
                    stats.short_examples),
    ]
    top, top_count = stats.answers.most_common(1)[0] if stats.answers else ("", 0)
    repeated = _frac_check("repeated_answer", top_count, len(stats.answer_words), t.max_repeated_answer_frac,
                           f"share one short answer ({top[:60]!r})",
                           "the target gives the same reply to different prompts: it is not seeing the "
                           f"prompts (template or prompt formatting) or {THINKING_OFF}", [])
    checks += [
        repeated,
        _frac_check("truncated", stats.truncated, stats.finish_known, t.max_truncated_frac,
                    "stopped at max_tokens (finish_reason=length)",
                    "responses are cut off: raise stages.generate.max_tokens (long reasoning needs room) "
                    "or check for looping output", stats.truncated_examples,
                    skipped="" if stats.finish_known else "no finish_reason in the input"),
        _frac_check("think_markers", stats.unbalanced, stats.think_known, t.max_unbalanced_think_frac,
                    "have missing, unclosed or inline think markers",
                    "reasoning is not split from answers: turn on the server's reasoning parser "
                    "(SGLang --reasoning-parser qwen3) and check the chat template", stats.unbalanced_examples,
                    skipped="" if stats.think_known else "answers not known (give --tokenizer)"),
        _frac_check("duplicate_responses", stats.duplicates, len(stats.answer_words), t.max_duplicate_response_frac,
                    "repeat an earlier response word for word",
                    "prompts were generated more than once or the output collapsed: check dataset.dedupe "
                    "and stages.generate.temperature", stats.duplicate_examples),
        _spike_check(stats, t),
        _frac_check("rejected", stats.rejected, stats.n, t.max_rejected_frac,
                    "were refused by the server (HTTP 4xx; the records keep its error)",
                    "prompts the server will not take, most often prompt + max_tokens over its --context-length: "
                    "leave stages.generate.context_length unset (the target's own) or drop the long prompts",
                    stats.rejected_examples),
    ]
    return checks


def _spike_check(stats: QCStats, t: QCThresholds) -> Check:
    small = Counter(v for v in stats.mask_sizes if v <= t.mask_spike_max_tokens)
    size, count = small.most_common(1)[0] if small else (0, 0)
    what = (f"have a loss mask of exactly {size} {stats.unit} (the commonest size up to "
            f"{t.mask_spike_max_tokens})" if small else f"have a loss mask of {t.mask_spike_max_tokens} "
            f"{stats.unit} or fewer")
    return _frac_check("mask_spike", count, len(stats.mask_sizes), t.max_mask_spike_frac, what,
                       f"responses are near-empty: {THINKING_OFF}", [])


@dataclass
class QCResult:
    passed: bool
    checks: list[Check]
    stats: QCStats
    unit_note: str
    path: str

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    def message(self) -> str:
        """Plain-words summary naming every failed check, for StageFailed and the CLI."""
        if self.passed:
            return f"QC passed: {len(self.checks)} checks on {self.stats.n} samples of {self.path}"
        lines = [f"QC failed: {len(self.failed)} of {len(self.checks)} checks on {self.stats.n} samples "
                 f"of {self.path}"]
        if any(THINKING_OFF in c.cause for c in self.failed):
            lines.append(f"Likely cause: responses are empty or near-empty — {THINKING_OFF}.")
        lines += [f"- {c.line()}" for c in self.failed]
        return "\n".join(lines)

    def metrics(self) -> dict[str, Any]:
        """Flat numbers for the stage record: pass/fail, sample count and each check's value."""
        out: dict[str, Any] = {"passed": self.passed, "samples": self.stats.n, "failed_checks": len(self.failed)}
        out.update({f"{c.name}_frac": c.value for c in self.checks if c.value is not None})
        return out

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "path": self.path, "samples": self.stats.n, "unit": self.stats.unit,
                "unit_note": self.unit_note, "checks": [asdict(c) for c in self.checks],
                "per_source": self.stats.per_source()}


def _with_mask_sizes(samples: Iterable[QCSample], masker: Any, every: int, batch: int = 256) -> Iterator[QCSample]:
    """Measure exact loss-mask sizes of every `every`-th sample with the tokenizer, in batches."""
    it = iter(samples)
    index = 0
    while chunk := list(islice(it, batch)):
        picked = [s for i, s in enumerate(chunk, start=index) if i % every == 0 and s.conversation is not None
                  and s.mask_size is None]
        index += len(chunk)
        for s, enc in zip(picked, masker.encode_conversations([s.conversation for s in picked])):
            s.mask_size = int(enc.loss_mask.sum())
        yield from chunk


def run_qc(path: str | Path, thresholds: QCThresholds, tokenizer_path: str | Path | None = None,
           enable_thinking: bool = True, template_kwargs: dict[str, Any] | None = None,
           mask_sample: int = 0) -> QCResult:
    """Run every check over the data at `path` (completions, chat JSONL or a tokenized dataset).

    With a tokenizer, loss-mask sizes of JSONL inputs are measured on an even spread of at most
    `mask_sample` samples (0 = all) and the others are left out of the mask-size histogram."""
    masker = None
    if tokenizer_path is not None:
        from dflashx.data.chat_mask import ChatMasker

        masker = ChatMasker.from_path(tokenizer_path, enable_thinking=enable_thinking, template_kwargs=template_kwargs)
    tokenized = is_tokenized_dataset(path)
    samples = iter_samples(path, masker.tokenizer if masker else None)
    stats = QCStats(min_answer_words=thresholds.min_answer_words)
    if tokenized or masker is not None:
        stats.unit = "tokens"
        note = "loss-mask sizes are tokens"
    else:
        note = ("no tokenizer given: loss-mask sizes are counted as whitespace-separated words of "
                "reasoning + answer, not tokens")
    if masker is not None and not tokenized:

        total = count_records(path)
        every = max(1, -(-total // mask_sample)) if mask_sample else 1
        samples = _with_mask_sizes(samples, masker, every)
        if every > 1:
            note += f" (measured on every {every}th sample)"
    for sample in samples:
        stats.add(sample)
    checks = evaluate(stats, thresholds, enable_thinking)
    return QCResult(all(c.passed for c in checks), checks, stats, note, str(path))
