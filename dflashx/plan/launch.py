"""The typed launch plans: the generate stage's (which servers run where, and how many requests each keeps
open) and the train stage's (`TrainLaunch`: the DeepSpeed or torchrun argv, its world size and nodes).

The planner builds the generate stage's once (`plan.expand.servers.launch_plan`); plan.json stores it in the
generate stage's entry (`to_json`) and `dflashx.run.rundir.load_plan` reads it back (`from_json`, the same
object), so the client keeps open exactly what the estimate assumed and starts exactly the servers the plan
lists. The shape (an immutable plan of one frozen spec per service) follows SpecForge's `LaunchPlan` /
`ServiceSpec`, which issue 22 names as the model (sgl-project/SpecForge); the fields are dflashx's own.

"Launch" means one thing in dflashx: a stage's launch plan, the processes it starts and where (these types;
`StagePlan.launch` and `StagePlan.train_launch` hold them). The serving mode that starts servers is `spawn`, and
the train stage's command line is `ResolvedTrainStage.launch_argv`.

Modes (the resolved `stages.generate.serving.mode`, `dflashx.resolve.serving.serving_mode`):
  spawn       the generate stage starts `servers` (each node only its own: `node`) and waits for all of them
  attach      `stages.generate.urls`: servers someone else started; nothing is launched
  in-process  the transformers backend: no server, `in_flight_per_replica` is its batch
Addresses: a node-0 server is `127.0.0.1`; a server on node i > 0 is named `node-<i>` (`node_name`, the names
the training hostfile uses) until the run maps it to a real host (`dflashx.backends.nodes.node_address`).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from typing import Any, Callable

from dflashx.resolve.deepspeed import HOSTFILE

from dflashx.resolve.model import ServingMode as Mode
LOCAL_HOST = "127.0.0.1"


def base_url(url: str) -> str:
    """`http://host:port` from a URL that may end in `/` or `/v1`."""
    url = url.rstrip("/")
    return url.removesuffix("/v1")


def node_name(node: int) -> str:
    """The planned name of node `node` (`node-<i>`) until the run maps it to a real address."""
    return f"node-{node}"


def node_host(node: int) -> str:
    """The planned host of a server on `node`: this machine for node 0, `node-<i>` for the others."""
    return LOCAL_HOST if node == 0 else node_name(node)


def split_in_flight(total: int, parts: int) -> tuple[int, ...]:
    """`total` requests over `parts` URLs as evenly as integers allow (the first ones take the remainder);
    the parts add up to `total`, so the client keeps open what the estimate counted."""
    if parts <= 0:
        return ()
    base, extra = divmod(total, parts)
    return tuple(base + (i < extra) for i in range(parts))


@dataclass(frozen=True)
class ServerSpec:
    """One inference server: launched (`command` on `node`, `gpus` its CUDA_VISIBLE_DEVICES, `env` what else its
    environment sets) or attached (no command, no node: a URL someone else serves). `in_flight`: requests the client
    keeps open on it (the per-replica in-flight count x the replicas behind it). A command's leading `python` is
    the interpreter `stages.generate.server_python` names (`dflashx.backends.servers`)."""

    url: str
    in_flight: int
    command: tuple[str, ...] = ()
    port: int | None = None
    gpus: tuple[int, ...] = ()
    node: int | None = None
    env: tuple[tuple[str, str], ...] = ()

    @property
    def host(self) -> str:
        return self.url.split("://", 1)[-1].rsplit(":", 1)[0]

    def at_host(self, host: str) -> ServerSpec:
        """The same server reached at `host` (a real address for a planned `node-<i>` name)."""
        return replace(self, url=f"http://{host}:{self.port}")

    def to_json(self) -> dict[str, Any]:
        return {"command": list(self.command), "port": self.port, "url": self.url, "gpus": list(self.gpus),
                "node": self.node, "in_flight": self.in_flight, "env": dict(self.env)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ServerSpec:
        return cls(str(data["url"]), int(data["in_flight"]), tuple(str(c) for c in data.get("command") or ()),
                   None if data.get("port") is None else int(data["port"]),
                   tuple(int(g) for g in data.get("gpus") or ()),
                   None if data.get("node") is None else int(data["node"]),
                   tuple((str(k), str(v)) for k, v in (data.get("env") or {}).items()))


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
        """The servers `node` starts (spawn mode); attached servers belong to no node."""
        return tuple(s for s in self.servers if s.node == node and s.command)

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "in_flight_per_replica": self.in_flight_per_replica,
                "servers": [s.to_json() for s in self.servers],
                "router": self.router.to_json() if self.router else None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LaunchPlan:
        router = data.get("router")
        return cls("spawn" if data["mode"] == "launch" else data["mode"],  # plan.json before issue 39: `launch`
                   int(data["in_flight_per_replica"]),
                   tuple(ServerSpec.from_json(s) for s in data.get("servers") or ()),
                   RouterSpec.from_json(router) if router else None)


@dataclass(frozen=True)
class TrainLaunch:
    """How the train stage starts its processes: `argv` (`stages.train.launch_argv` of the resolved recipe, `{run_dir}`
    still in it), `world_size` processes over `nodes` nodes, and `deepspeed_config`, the config the engine is
    built with. On several nodes `argv` reads the hostfile at `hostfile_path`, one `<host> slots=<per node>`
    line per node, which the train stage writes with the nodes' real addresses before it launches."""

    argv: tuple[str, ...]
    world_size: int
    nodes: int
    deepspeed_config: dict[str, Any]

    @property
    def shell(self) -> str:
        return shlex.join(self.argv)

    @property
    def hostfile_path(self) -> str | None:
        """Where `argv` reads the hostfile (`{run_dir}` not filled in); None when it reads none (one node)."""
        return HOSTFILE if HOSTFILE in self.argv else None

    def hostfile(self, host: Callable[[int], str] = node_name) -> tuple[str, ...]:
        """The hostfile's lines with node i named `host(i)` (the planned `node-<i>` by default); () on one node."""
        if self.nodes == 1:
            return ()
        return tuple(f"{host(i)} slots={self.world_size // self.nodes}" for i in range(self.nodes))

    def to_json(self) -> dict[str, Any]:
        """The train stage's entry keys of plan.json: `deepspeed_config` and `launch`."""
        return {"deepspeed_config": self.deepspeed_config,
                "launch": {"command": list(self.argv), "shell": self.shell, "hostfile": list(self.hostfile()) or None,
                           "world_size": self.world_size}}

    @classmethod
    def from_json(cls, entry: dict[str, Any]) -> TrainLaunch:
        """From the train stage's entry of plan.json (`to_json`); the nodes are the hostfile's lines."""
        launch = entry["launch"]
        return cls(tuple(str(a) for a in launch["command"]), int(launch["world_size"]),
                   len(launch["hostfile"] or ()) or 1, dict(entry["deepspeed_config"]))


__all__ = ["LOCAL_HOST", "LaunchPlan", "Mode", "RouterSpec", "ServerSpec", "TrainLaunch", "base_url", "node_host",
           "node_name", "split_in_flight"]
