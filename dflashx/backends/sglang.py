"""SGLang's servers (`http.ServerBackend`): the accepted length of speculative decoding from `/get_server_info`."""

from __future__ import annotations

from typing import Any

import httpx

from dflashx.backends.http import ServerBackend


def accept_length_of(infos: list[dict[str, Any]]) -> float | None:
    """Tokens per draft-verify cycle the servers report (speculative decoding on), else None.

    SGLang's `/get_server_info` lists one `internal_states` entry per scheduler: the cumulative
    `spec_cumulative_num_accept_tokens` / `spec_cumulative_num_forward_ct` where the version keeps them
    (pooled over schedulers), else the mean of their `avg_spec_accept_length` (None without speculation)."""
    states = [st for info in infos for st in (info.get("internal_states") or []) if isinstance(st, dict)]
    accepted = sum(float(st.get("spec_cumulative_num_accept_tokens") or 0) for st in states)
    cycles = sum(float(st.get("spec_cumulative_num_forward_ct") or 0) for st in states)
    if cycles > 0:
        return accepted / cycles
    averages = [float(st["avg_spec_accept_length"]) for st in states if st.get("avg_spec_accept_length")]
    return sum(averages) / len(averages) if averages else None


class SGLangBackend(ServerBackend):
    name = "sglang"

    async def accept_length(self, http: httpx.AsyncClient) -> float | None:
        infos = []
        for resp in await self._each(http, "/get_server_info"):
            try:
                infos.append(resp.json())
            except ValueError:
                continue
        return accept_length_of([i for i in infos if isinstance(i, dict)])
