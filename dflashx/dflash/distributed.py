"""The process group of a training job: joined at start, closed at the end.

Under a launcher (`torchrun`, `deepspeed`) the rank, world size and rendezvous come from the
environment it sets. A lone process (the CPU profile, tests, one GPU) gets a one-rank group on a
free loopback port. DeepSpeed compiles no op for a job: the optimizers are torch's
(`dflashx.resolve.deepspeed.optimizer_config`), and on CPU its shared-memory all-reduce op, which
only its inference all-reduce uses, is switched off at any world size (`_skip_cpu_shared_memory_op`).
NVLink SHARP / multicast (NVLS) is off unless the environment says otherwise (`SAFE_NCCL_ENV`, also
given to launched processes).
"""

from __future__ import annotations

import logging
import os
import random
import socket
from pathlib import Path

import torch


SAFE_NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def free_port() -> int:
    """A free loopback TCP port below the kernel's ephemeral range, so that no outgoing connection
    can take it between this check and the process group's bind (which may come a minute later,
    after DeepSpeed builds its ops)."""
    try:
        ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    rng = random.Random()  # its own generator: the training RNG state is checkpointed
    for _ in range(200):
        port = rng.randint(min(20000, ephemeral // 2), ephemeral - 1)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free TCP port below the ephemeral range for the process group; set MASTER_PORT")


def setup_distributed() -> tuple[int, int, int]:
    """Rank, world size and local rank; a lone process gets a one-rank group (gloo on CPU)."""
    import deepspeed

    lone = "MASTER_PORT" not in os.environ  # no launcher: a one-rank group on a free loopback port
    if lone:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(free_port())
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(key, value)
    for key, value in SAFE_NCCL_ENV.items():
        os.environ.setdefault(key, value)
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    if not torch.cuda.is_available():
        _skip_cpu_shared_memory_op()
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    if lone:  # the group holds that port now: child processes must not inherit it as theirs
        del os.environ["MASTER_PORT"]
    local = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), local


def _skip_cpu_shared_memory_op() -> None:
    """Skip compiling DeepSpeed's shared-memory all-reduce op on CPU (`deepspeed_shm_comm`, about a
    minute of C++ on a fresh machine, built at `init_distributed`): DeepSpeed's torch backend calls it
    only from `inference_all_reduce`; training's all-reduces, all-gathers and reduce-scatters go
    through torch.distributed (gloo) with or without it. DeepSpeed asks
    `deepspeed.ops.__compatible_ops__` whether the op can build; saying no leaves it unbuilt."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def teardown_distributed() -> None:
    """Wait for every rank (rank 0 exports last), then close the process group: a rank that exits
    with the group still open can abort in its communication threads (SIGABRT) and fail the job."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
