"""The server backends' client: an OpenAI-compatible server (SGLang, vLLM) over HTTP, never imported.

Servers come from the typed launch plan (`dflashx.plan.launch`): `ServerPool` starts this node's and
reaches the others, or (attach) waits for `stages.generate.urls`. Requests go to `/v1/chat/completions`
with the recipe's sampling settings and `chat_template_kwargs: {enable_thinking, ...}`. Each URL gets as
many asyncio workers as its `in_flight` in the launch plan (the per-replica in-flight count x the replicas
behind it; attached URLs share what the estimate counts), nothing re-defaulted here; they pull from one
bounded queue, so faster replicas take more work and memory stays bounded.
A transient failure (connection error or drop, timeout, HTTP 408/409/425/429/5xx, an unreadable body) is
retried on the next replica after an exponential back-off with jitter; other 4xx answers are final
and recorded with `error`. When 2 x (all workers) prompts in a row fail every retry,
the servers are taken to be down and the run stops (what was written is kept). A launched server that exits
while generating is started again (`ServerPool.revive`, at most `stages.generate.server_restarts` times) and
its prompts are retried. After the last prompt each engine reads its servers' accepted length of speculative
decoding (`ServerBackend.accept_length`: `sglang.py`, `vllm.py`). The reasoning comes from
`reasoning_content` (the engines' `--reasoning-parser`) or `reasoning`; without either, `<think>...</think>`
in the content is split.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any, Iterable

import httpx

from dflashx.backends.base import Backend, Emit, completion_record, rejected_record, split_think
from dflashx.backends.nodes import node_rank
from dflashx.backends.servers import LaunchArgs, ServerError, ServerPool
from dflashx.config.schema import ChatTemplateSpec, GenerateStage
from dflashx.plan.launch import LaunchPlan

RETRY_STATUS = {408, 409, 425, 429}
MAX_BACKOFF_S = 60.0


class TransientError(Exception):
    """A failure worth retrying."""


def backoff_s(attempt: int, base_s: float) -> float:
    """Exponential back-off with jitter: uniform in [0.5, 1] x min(cap, base x 2^attempt)."""
    return min(MAX_BACKOFF_S, base_s * 2**attempt) * random.uniform(0.5, 1.0)


class ServerBackend(Backend):
    """The client of one engine's servers (module doc); an engine's subclass names it and reads its servers'
    accepted length of speculative decoding."""

    name = "server"

    def __init__(self, cfg: GenerateStage, chat: ChatTemplateSpec, model: str, launch: LaunchPlan | None,
                 log_dir: Path | None = None, node: int | None = None, launch_args: LaunchArgs | None = None):
        super().__init__()
        if launch is None or launch.mode == "in-process" or not launch.servers:
            raise ValueError(
                f"stages.generate.backend is '{self.name}' but the plan lists no servers and stages.generate.urls is "
                "empty: give the URLs of running servers, or plan on a GPU profile")
        self.cfg = cfg
        self.chat = chat
        self.model = model
        self.node = node_rank() if node is None else node
        self.drives = self.node == 0  # node 0 sends the prompts; another node only serves (`serve`)
        self.pool = ServerPool(launch, self.node, log_dir or Path("."), cfg.server_startup_timeout_s,
                               args=launch_args or LaunchArgs(), restarts=cfg.server_restarts)
        self.urls = self.pool.urls
        self.in_flight = [s.in_flight for s in self.pool.servers]
        self.workers = sum(self.in_flight)
        self._fail_streak = 0

    def __enter__(self) -> "ServerBackend":
        self.pool.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.pool.__exit__(*exc)

    def serve(self) -> str:
        """Keep this node's servers up for node 0 until one stops; what stopped, in words."""
        return self.pool.hold()

    def generate(self, prompts: Iterable[dict[str, Any]], emit: Emit) -> None:
        try:
            asyncio.run(self._generate(prompts, emit))
        except ExceptionGroup as group:  # worker(s) failed and the others were cancelled: unwrap
            if len({type(e) for e in group.exceptions}) == 1:
                raise group.exceptions[0] from None
            raise

    # ------------------------------------------------------------------ async core

    async def _generate(self, prompts: Iterable[dict[str, Any]], emit: Emit) -> None:
        workers = self.workers
        limits = httpx.Limits(max_connections=workers, max_keepalive_connections=workers)
        timeout = httpx.Timeout(self.cfg.request_timeout_s, connect=min(30.0, self.cfg.request_timeout_s))
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as http:
            model = await self._served_model(http)
            queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(maxsize=2 * workers)
            async with asyncio.TaskGroup() as group:
                for replica, count in enumerate(self.in_flight):
                    for _ in range(count):
                        group.create_task(self._worker(http, model, replica, queue, emit))
                for prompt in prompts:
                    await queue.put(prompt)
                for _ in range(workers):
                    await queue.put(None)
            self.stats.spec_accept_length = await self.accept_length(http)

    async def accept_length(self, http: httpx.AsyncClient) -> float | None:
        """Tokens per draft-verify cycle the servers report (speculative decoding on), else None."""
        return None

    async def _each(self, http: httpx.AsyncClient, path: str) -> list[httpx.Response]:
        """Each server's answer to GET `path`, skipping any that does not answer it."""
        answers = []
        for url in self.urls:
            try:
                resp = await http.get(f"{url}{path}")
                resp.raise_for_status()
                answers.append(resp)
            except httpx.HTTPError:
                continue
        return answers

    async def _served_model(self, http: httpx.AsyncClient) -> str:
        """The name the first server serves (`/v1/models`), else the recipe's target model."""
        try:
            resp = await http.get(f"{self.urls[0]}/v1/models")
            resp.raise_for_status()
            return resp.json()["data"][0]["id"]
        except (httpx.HTTPError, KeyError, IndexError, ValueError):
            return self.model

    async def _worker(self, http: httpx.AsyncClient, model: str, replica: int,
                      queue: asyncio.Queue, emit: Emit) -> None:
        while (prompt := await queue.get()) is not None:
            record = await self._complete(http, model, replica, prompt)
            if record is not None:
                emit(record)

    def _body(self, model: str, prompt: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "messages": prompt["messages"],
            "max_tokens": self.cfg.max_tokens,
            "temperature": self.cfg.temperature,
            "top_p": self.cfg.top_p,
            "chat_template_kwargs": {**self.chat.kwargs, "enable_thinking": self.chat.enable_thinking},
        }
        if prompt.get("tools"):
            body["tools"] = prompt["tools"]
        return body

    async def _complete(self, http: httpx.AsyncClient, model: str, replica: int,
                        prompt: dict[str, Any]) -> dict[str, Any] | None:
        body = self._body(model, prompt)
        attempt = 0
        while True:
            url = self.urls[(replica + attempt) % len(self.urls)]
            try:
                async with asyncio.timeout(self.cfg.request_timeout_s):
                    resp = await http.post(f"{url}/v1/chat/completions", json=body)
                if resp.status_code in RETRY_STATUS or resp.status_code >= 500:
                    raise TransientError(f"HTTP {resp.status_code} from {url}: {resp.text[:300]}")
                if resp.status_code >= 400:
                    record = self._rejected(prompt, f"HTTP {resp.status_code} from {url}: {resp.text[:500]}")
                else:
                    record = self._parse(prompt, resp)
                self._fail_streak = 0
                return record
            except (httpx.TransportError, TimeoutError, TransientError) as e:
                message = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                if await self.pool.revive(url):  # a launched server had exited: started again, not an attempt
                    self.stats.server_restarts = self.pool.restarted
                    continue
                if attempt == self.cfg.retries:
                    self._gave_up(prompt, message)
                    return None
                self.stats.retries += 1
                await asyncio.sleep(backoff_s(attempt, self.cfg.retry_backoff_s))
                attempt += 1

    def _gave_up(self, prompt: dict[str, Any], message: str) -> None:
        self.stats.failed += 1
        self.stats.note_error(f"prompt {prompt['id']}: {message}")
        self._fail_streak += 1
        if self._fail_streak >= 2 * self.workers:
            raise ServerError(
                f"{self._fail_streak} prompts in a row failed after {self.cfg.retries} retries (last: {message}); "
                f"the servers at {', '.join(self.urls)} seem down. Completions written so far are kept: "
                f"rerun to resume once the servers answer."
            )

    def _rejected(self, prompt: dict[str, Any], error: str) -> dict[str, Any]:
        self.stats.rejected += 1
        self.stats.note_error(f"prompt {prompt['id']}: {error}")
        return rejected_record(prompt, error, self.name)

    def _parse(self, prompt: dict[str, Any], resp: httpx.Response) -> dict[str, Any]:
        try:
            data = resp.json()
            choice = data["choices"][0]
            message = choice["message"]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise TransientError(f"unreadable completion body ({e!r}): {resp.text[:200]}") from None
        content = message.get("content") or ""
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        if reasoning is None:
            reasoning, answer = split_think(content)
        else:
            answer = content.strip()
        usage = data.get("usage") or {}
        return completion_record(
            prompt,
            reasoning=reasoning.strip(),
            answer=answer,
            finish_reason=choice.get("finish_reason") or "stop",
            prompt_tokens=usage.get("prompt_tokens", 0),
            completion_tokens=usage.get("completion_tokens", 0),
            backend=self.name,
        )
