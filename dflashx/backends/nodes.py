"""The nodes of a multi-node profile: which one this machine is, and where the others are.

`node_rank`: this machine's node (`DFLASHX_NODE_RANK`, which `dflashx run --node-rank K` sets; 0 when unset).
`node_address(i)`: node i's real address, `DFLASHX_NODE_HOSTS`'s i-th entry (node 0 first), else its planned
name `node-<i>` (`dflashx.plan.launch.node_name`, which /etc/hosts may map), and it must resolve. Both the
generation servers (`dflashx.backends.servers.reachable`) and the training hostfile (`dflashx.stages.train`) map
nodes with it. The environment is read at call time (`datasets` rebinds `os.environ` in multi-process maps; a
default bound at import would keep the old mapping).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from dflashx.plan.launch import node_name

NODE_RANK_ENV = "DFLASHX_NODE_RANK"  # this machine's node in the profile (0 .. nodes-1); `dflashx run --node-rank`
NODE_HOSTS_ENV = "DFLASHX_NODE_HOSTS"  # the nodes' addresses, node 0 first, comma-separated


class NodeAddressError(RuntimeError):
    """A node's address does not resolve (the message names the node, the address and the fix)."""


def node_rank(env: Mapping[str, str] | None = None) -> int:
    """This machine's node: `DFLASHX_NODE_RANK` (set by `dflashx run --node-rank K`), else 0."""
    env = os.environ if env is None else env
    raw = env.get(NODE_RANK_ENV, "0").strip() or "0"
    if not raw.isdigit():
        raise ValueError(f"{NODE_RANK_ENV}={raw!r} is not a node index: set it to 0 on the first node, 1 on the "
                         f"second, ... (or pass `dflashx run --node-rank K`)")
    return int(raw)


def node_hosts(env: Mapping[str, str] | None = None) -> dict[int, str]:
    """The addresses `DFLASHX_NODE_HOSTS` gives (node 0 first); empty when unset."""
    env = os.environ if env is None else env
    raw = env.get(NODE_HOSTS_ENV, "")
    return {i: h.strip() for i, h in enumerate(raw.split(",")) if h.strip()}


def resolvable(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError):
        return False
    return True


def node_address(node: int, env: Mapping[str, str] | None = None) -> str:
    """Node `node`'s address: `DFLASHX_NODE_HOSTS`'s entry for it, else its planned name `node-<i>`;
    `NodeAddressError` when that does not resolve (nothing then waits on an address that leads nowhere)."""
    host = node_hosts(env).get(node, node_name(node))
    if not resolvable(host):
        raise NodeAddressError(
            f"node {node}'s address {host!r} does not resolve. Set {NODE_HOSTS_ENV}=<node-0 host>,<node-1 host>,... "
            f"(node 0 first), or name the nodes node-<i> in /etc/hosts")
    return host
