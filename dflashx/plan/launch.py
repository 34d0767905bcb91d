"""The typed launch plan of the generate stage: which servers run where, and how many requests each keeps open.

The planner builds it once (`plan.expand.sglang.launch_plan`); plan.json stores it in the generate stage's
entry (`to_json`) and the run reads it back (`from_json`, the same object), so the client keeps open exactly
what the estimate assumed and starts exactly the servers the plan lists. The shape (an immutable plan of
one frozen spec per service) follows SpecForge's `LaunchPlan` / `ServiceSpec`, which issue 22 names as the
model (sgl-project/SpecForge); the fields are dflashx's own.

Modes (the resolved `stages.generate.serving.mode`, `dflashx.resolve.serving.serving_mode`):
  launch      the generate stage starts `servers` (each node only its own: `node`) and waits for all of them
  attach      `stages.generate.urls`: servers someone else started; nothing is launched
  in-process  the transformers backend: no server, `in_flight_per_replica` is its batch
Addresses: a node-0 server is `127.0.0.1`; a server on node i > 0 is named `node-<i>` (the names the
training hostfile uses) until the run maps it to a real host (`dflashx.backends.servers.node_hosts`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from dflashx.resolve.model import ServingMode as Mode
LOCAL_HOST = "127.0.0.1"


def base_url(url: str) -> str:
    """`http://host:port` from a URL that may end in `/` or `/v1`."""
    url = url.rstrip("/")
    return url.removesuffix("/v1")


def node_host(node: int) -> str:
    """The planned host of a server on `node`: this machine for node 0, `node-<i>` for the others."""
    return LOCAL_HOST if node == 0 else f"node-{node}"


def split_in_flight(total: int, parts: int) -> tuple[int, ...]:
    """`total` requests over `parts` URLs as evenly as integers allow (the first ones take the remainder);
    the parts add up to `total`, so the client keeps open what the estimate counted."""
    if parts <= 0:
        return ()
    base, extra = divmod(total, parts)
    return tuple(base + (i < extra) for i in range(parts))


@dataclass(frozen=True)
class ServerSpec:
    """One inference server: launched (`command` on `node`, `gpus` its CUDA_VISIBLE_DEVICES) or attached
    (no command, no node: a URL someone else serves). `in_flight`: requests the client keeps open on it
    (the per-replica in-flight count x the replicas behind it)."""

    url: str
    in_flight: int
    command: tuple[str, ...] = ()
    port: int | None = None
    gpus: tuple[int, ...] = ()
    node: int | None = None

    @property
    def host(self) -> str:
        return self.url.split("://", 1)[-1].rsplit(":", 1)[0]

    def at_host(self, host: str) -> ServerSpec:
        """The same server reached at `host` (a real address for a planned `node-<i>` name)."""
        return replace(self, url=f"http://{host}:{self.port}")

    def to_json(self) -> dict[str, Any]:
        return {"command": list(self.command), "port": self.port, "url": self.url, "gpus": list(self.gpus),
                "node": self.node, "in_flight": self.in_flight}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ServerSpec:
        return cls(str(data["url"]), int(data["in_flight"]), tuple(str(c) for c in data.get("command") or ()),
                   None if data.get("port") is None else int(data["port"]),
                   tuple(int(g) for g in data.get("gpus") or ()),
                   None if data.get("node") is None else int(data["node"]))


@dataclass(frozen=True)
class RouterSpec:
    """`sglang_router` in front of the servers (router dp_mode), for people who serve through one: the
    generate client itself spreads requests over the servers."""

    command: tuple[str, ...]
    port: int
    url: str

    def to_json(self) -> dict[str, Any]:
        return {"command": list(self.command), "port": self.port, "url": self.url}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RouterSpec:
        return cls(tuple(str(c) for c in data["command"]), int(data["port"]), str(data["url"]))


@dataclass(frozen=True)
class LaunchPlan:
    """How generation is served (module doc). `in_flight_per_replica`: requests the client keeps open per
    replica, `stages.generate.concurrency` when set, else the planned running batch."""

    mode: Mode
    in_flight_per_replica: int
    servers: tuple[ServerSpec, ...] = ()
    router: RouterSpec | None = None

    @property
    def nodes(self) -> tuple[int, ...]:
        return tuple(sorted({s.node for s in self.servers if s.node is not None}))

    def on_node(self, node: int) -> tuple[ServerSpec, ...]:
        """The servers `node` starts (launch mode); attached servers belong to no node."""
        return tuple(s for s in self.servers if s.node == node and s.command)

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "in_flight_per_replica": self.in_flight_per_replica,
                "servers": [s.to_json() for s in self.servers],
                "router": self.router.to_json() if self.router else None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LaunchPlan:
        router = data.get("router")
        return cls(data["mode"], int(data["in_flight_per_replica"]),
                   tuple(ServerSpec.from_json(s) for s in data.get("servers") or ()),
                   RouterSpec.from_json(router) if router else None)


@dataclass(frozen=True)
class StageRuntime:
    """What the plan hands one stage when it runs, typed: its planned storage (a full disk names what is still
    needed) and, for generate, the launch plan. Read back from plan.json's stage entry by `from_json`."""

    storage_bytes: float = 0.0
    launch: LaunchPlan | None = None

    @classmethod
    def from_json(cls, entry: dict[str, Any]) -> StageRuntime:
        """From one stage's entry of plan.json (`StagePlan.to_json`); `{}` gives the empty runtime."""
        estimates = entry.get("estimates") or {}
        return cls(float(estimates.get("storage_bytes") or 0.0),
                   LaunchPlan.from_json(entry) if "mode" in entry else None)


__all__ = ["LOCAL_HOST", "LaunchPlan", "Mode", "RouterSpec", "ServerSpec", "StageRuntime", "base_url", "node_host",
           "split_in_flight"]
