"""Start the ranks (or join torchrun's) and initialise ``torch.distributed``.

Started by hand (``python -m h3app generate --ulysses 2 …``), the command becomes rank 0 and re-runs its own
command line (``sys.orig_argv``) N−1 times with ``RANK``/``WORLD_SIZE``/``MASTER_*`` set, exactly the variables
torchrun sets; under ``torchrun`` (one node or several) nothing is started and every rank joins. Every rank then
runs the same command: rank 0 serves (CLI or Gradio) and leads, the others follow (``h3app.parallel.follower``).
nccl on CUDA, gloo on CPU.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from ..errors import H3AppError
from .group import RankGroup, Spawned
from .timeouts import POLL_S, STARTUP_S, as_timedelta
from .topology import ParallelSpec, spec_from_args

LEADER_PID_ENV = "H3APP_PARALLEL_LEADER_PID"


def start_ranks(args: argparse.Namespace) -> RankGroup | None:
    """None for one rank; else this process's :class:`RankGroup`. On CUDA, ``args.device`` becomes this rank's
    own GPU (``cuda:LOCAL_RANK``): every rank holds the whole model on its own device."""
    spec = spec_from_args(args)
    env_world = os.environ.get("WORLD_SIZE")
    if not spec.enabled:
        if env_world is not None and int(env_world) > 1:
            raise H3AppError(f"this runs under torchrun with {env_world} ranks but asks for one: add "
                             f"--ulysses {env_world} (or --ring).")
        return None
    if spec.ring > 1 and not _gpu_device(args.device):
        raise H3AppError("--ring needs an attention backend that returns the log-sum-exp (cuDNN/flash on CUDA); "
                         "on CPU use --ulysses N instead.")
    if env_world is None:
        return _launch(spec, args)
    if int(env_world) != spec.world_size:
        raise H3AppError(f"torchrun started {env_world} ranks but --ulysses × --ring is {spec.world_size}: make "
                         f"them equal (e.g. torchrun --nproc-per-node {spec.world_size}).")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    _place(args, local_rank)
    leader_pid = os.environ.get(LEADER_PID_ENV)
    if leader_pid is not None:
        _exit_with_leader(int(leader_pid))
    rank = int(os.environ["RANK"])
    _init(args.device, spec, "env://", rank)
    return RankGroup(spec, rank=rank, device=args.device)


def close_ranks(group: RankGroup | None) -> None:
    """End of a command: rank 0 stops the followers; every rank leaves the group (no-op for one rank)."""
    if group is not None:
        group.close()


def _launch(spec: ParallelSpec, args: argparse.Namespace) -> RankGroup:
    _place(args, 0)  # a missing GPU is refused before any rank starts
    port = _free_port()
    logs = Path(tempfile.mkdtemp(prefix="h3app-ranks-"))
    children = []
    for rank in range(1, spec.world_size):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(spec.world_size),
               "LOCAL_WORLD_SIZE": str(spec.world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               LEADER_PID_ENV: str(os.getpid())}
        log = logs / f"rank-{rank}.log"
        with open(log, "wb") as stream:
            process = subprocess.Popen(list(sys.orig_argv), env=env, stdout=subprocess.DEVNULL, stderr=stream,
                                       stdin=subprocess.DEVNULL)
        children.append(Spawned(rank=rank, process=process, log=log))
    try:
        _init(args.device, spec, f"tcp://127.0.0.1:{port}", 0)
    except BaseException:
        for child in children:
            child.process.kill()
        raise
    return RankGroup(spec, rank=0, device=args.device, spawned=children)


def _init(device: str, spec: ParallelSpec, init_method: str, rank: int) -> None:
    import torch.distributed as dist

    # diffusers sizes "anything"-mode shards over the CPU backend when the group names one ("cpu:gloo")
    backend = "cpu:gloo,cuda:nccl" if _gpu_device(device) else "cpu:gloo"
    try:
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=spec.world_size,
                                timeout=as_timedelta(max(spec.timeout_s, STARTUP_S)))
    except (RuntimeError, ValueError) as error:
        raise H3AppError(f"the {spec.world_size} ranks did not meet ({type(error).__name__}: "
                         f"{' '.join(str(error).split())[:160]}); check MASTER_ADDR/MASTER_PORT and that every "
                         f"rank started.") from error


def _gpu_device(device: str) -> bool:
    return str(device).startswith("cuda")


def _place(args: argparse.Namespace, local_rank: int) -> None:
    if not _gpu_device(args.device):
        return
    import torch

    from ..model.loader import check_device

    check_device(args.device)
    if local_rank >= torch.cuda.device_count():
        raise H3AppError(f"rank {local_rank} of this machine has no GPU ({torch.cuda.device_count()} visible): use "
                         f"at most that many ranks per machine.")
    args.device = f"cuda:{local_rank}"
    torch.cuda.set_device(local_rank)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _exit_with_leader(leader_pid: int) -> None:
    """A rank we started ends when its leader ends, even one killed with SIGKILL (no orphan holds a GPU)."""

    def watch() -> None:
        while True:
            if os.getppid() != leader_pid:
                os._exit(3)
            threading.Event().wait(POLL_S)

    threading.Thread(target=watch, name="h3app-leader-watch", daemon=True).start()
