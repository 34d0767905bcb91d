"""vLLM's servers (`http.ServerBackend`): the speculative-decoding counters of its Prometheus `/metrics`.

vLLM (v1 engine, 0.32: `vllm/v1/spec_decode/metrics.py`) counts per engine `vllm:spec_decode_num_drafts`
(draft-verify cycles that drafted), `vllm:spec_decode_num_draft_tokens`, `vllm:spec_decode_num_accepted_tokens`
and `vllm:spec_decode_num_accepted_tokens_per_pos{position="i"}` (cycles whose draft position i, 0-based, was
accepted), exported as counters with a `_total` suffix. Tokens per cycle = 1 + accepted / drafts; the acceptance
at draft position i + 1 = accepted_per_pos[i] / drafts (`dflashx.dflash.acceptance` counts ours alike).

Public API: `SpecCounters.parse(text)`, `SpecCounters.read(url)`, `VLLMBackend`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import httpx

from dflashx.backends.http import ServerBackend

_SAMPLE = re.compile(r'^(vllm:spec_decode_num_[a-z_]+?)(?:_total)?(?:\{([^}]*)\})?\s+([0-9.eE+-]+)\s*$')
_POSITION = re.compile(r'position="(\d+)"')


@dataclass(frozen=True)
class SpecCounters:
    """vLLM's speculative-decoding counters, summed over its engines (module doc)."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    accepted_per_pos: tuple[float, ...] = field(default_factory=tuple)

    @classmethod
    def parse(cls, text: str) -> "SpecCounters":
        """The counters in a Prometheus text exposition (`/metrics`); zeros where vLLM drafts nothing."""
        totals: dict[str, float] = {}
        per_pos: dict[int, float] = {}
        for line in text.splitlines():
            m = _SAMPLE.match(line.strip())
            if not m or m.group(1).endswith("_created"):
                continue
            name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
            if name == "vllm:spec_decode_num_accepted_tokens_per_pos":
                pos = _POSITION.search(labels)
                if pos:
                    per_pos[int(pos.group(1))] = per_pos.get(int(pos.group(1)), 0.0) + value
                continue
            totals[name] = totals.get(name, 0.0) + value
        return cls(totals.get("vllm:spec_decode_num_drafts", 0.0), totals.get("vllm:spec_decode_num_draft_tokens", 0.0),
                   totals.get("vllm:spec_decode_num_accepted_tokens", 0.0),
                   tuple(per_pos[i] for i in sorted(per_pos)))

    @classmethod
    def read(cls, url: str, timeout_s: float = 30.0) -> "SpecCounters":
        resp = httpx.get(f"{url.rstrip('/')}/metrics", timeout=timeout_s)
        resp.raise_for_status()
        return cls.parse(resp.text)

    def __sub__(self, before: "SpecCounters") -> "SpecCounters":
        """What was counted since `before` (counters only grow)."""
        n = max(len(self.accepted_per_pos), len(before.accepted_per_pos))
        pos = [(self.accepted_per_pos + (0.0,) * n)[i] - (before.accepted_per_pos + (0.0,) * n)[i] for i in range(n)]
        return SpecCounters(self.drafts - before.drafts, self.draft_tokens - before.draft_tokens,
                            self.accepted - before.accepted, tuple(pos))

    @property
    def tau(self) -> float | None:
        """Tokens per draft-verify cycle: 1 + accepted / drafts (None before any draft)."""
        return 1.0 + self.accepted / self.drafts if self.drafts else None

    @property
    def acceptance_by_position(self) -> list[float]:
        """Share of cycles accepting draft position 1, 2, ... (vLLM's position i is our i + 1)."""
        return [a / self.drafts for a in self.accepted_per_pos] if self.drafts else []


class VLLMBackend(ServerBackend):
    name = "vllm"

    async def accept_length(self, http: httpx.AsyncClient) -> float | None:
        counters = [SpecCounters.parse(resp.text) for resp in await self._each(http, "/metrics")]
        drafts, accepted = sum(c.drafts for c in counters), sum(c.accepted for c in counters)
        return 1.0 + accepted / drafts if drafts else None
