"""Process groups for tensor-parallel runs: setup under torchrun, launching N ranks, the environment record (docs/tensor_parallel.md)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from specbench.env import gpu_name, hardware_class, nvidia_selector, nvml_query

# NVLink SHARP (multicast) stays off in everything specbench launches: it reserves memory on every GPU and
# is not available on every lent machine, so a run that used it would not be comparable
NCCL_SAFE_ENV = {"NCCL_NVLS_ENABLE": "0"}
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# messages of ranks that only lost their peer: another rank's failure is the cause, not theirs
PEER_LOSS_HINTS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "SIGTERM", "Signal 15")


@dataclass(frozen=True)
class RankContext:
    """What a rank knows about its place in the run."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device


class TensorParallelCaseError(RuntimeError):
    """A tensor-parallel case that failed on one of its ranks, or whose ranks emitted different tokens: that
    case's error (reported as its ERROR line), naming the rank."""

    def __init__(self, message: str, rank: int | None = None):
        self.rank = rank
        super().__init__(message)


class RankFailed(RuntimeError):
    """A launched rank raised or died; carries that rank's exception type, message and traceback."""

    def __init__(self, rank: int, error_type: str, message: str, traceback: str = "", others: tuple[str, ...] = ()):
        self.rank, self.error_type, self.message, self.traceback = rank, error_type, message, traceback
        also = f" (also failed: {'; '.join(others)})" if others else ""
        super().__init__(f"rank {rank} failed: {error_type}: {message}{also}")


class TorchrunRankFailed(Exception):
    """This process, one of torchrun's ranks, raised during its share of a tensor-parallel case. Its peers
    wait on it inside a collective, so the group cannot run another case: ``specbench run`` reports it (the
    rank, the case, the cause) and exits non-zero, and torchrun stops the other ranks. Deliberately neither a
    RuntimeError nor a ValueError, so that no per-case fault handler catches it and runs the next case."""

    def __init__(self, rank: int, world_size: int, label: str, cause: BaseException):
        self.rank, self.world_size, self.cause = rank, world_size, cause
        what = f"{type(cause).__name__}: {(str(cause).strip().splitlines() or [''])[0]}"
        self.peer_loss = any(hint in str(cause) for hint in PEER_LOSS_HINTS)
        if self.peer_loss:  # a consequence: the rank that failed first says why
            message = (f"rank {rank} of {world_size} (torchrun) lost another rank in {label} ({what}); that "
                       "rank's error is the cause")
        else:
            message = f"rank {rank} of {world_size} (torchrun) failed in {label}: {what}"
        super().__init__(message)


def default_backend() -> str:
    """nccl where CUDA is available, else gloo."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def init_from_env(backend: str | None = None) -> RankContext:
    """Join the process group torchrun (or :func:`launch`) describes in RANK, WORLD_SIZE, MASTER_ADDR and
    MASTER_PORT; gloo on the CPU, nccl on CUDA (one GPU per local rank, NVLink multicast off)."""
    missing = [name for name in TORCHRUN_ENV if name not in os.environ]
    if missing:
        raise RuntimeError(
            f"no process group described: {', '.join(missing)} unset; run under torchrun "
            "(torchrun --nproc-per-node N ...) or start the ranks with specbench.distributed.launch"
        )
    backend = backend or default_backend()
    local_rank = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
    device = torch.device("cpu")
    if backend == "nccl":
        for key, value in NCCL_SAFE_ENV.items():
            os.environ.setdefault(key, value)
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend, device_id=device if backend == "nccl" else None)
    return RankContext(dist.get_rank(), dist.get_world_size(), local_rank, backend, device)


def teardown() -> None:
    """Leave the process group (a no-op when none is initialised)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def free_port() -> int:
    """A TCP port free on this host now (for the rendezvous of one launch)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(fn: Callable, args: tuple, backend: str | None) -> Any:
    """Each launched rank: join the group, run ``fn(context, *args)``, leave the group. A rank that raises
    exits without leaving it: the launcher terminates the others, and no peer sees the group closed first."""
    context = init_from_env(backend)
    result = fn(context, *args)
    teardown()
    return result


def launch(fn: Callable, world_size: int, args: tuple = (), *, backend: str | None = None, port: int | None = None,
           start_method: str = "spawn") -> list[Any]:
    """Run ``fn(context, *args)`` on ``world_size`` local ranks through torch's elastic launcher (what torchrun
    runs) and return each rank's return value, rank 0 first. ``fn`` and ``args`` must pickle (a module-level
    function). A rank that raises stops the run: the others are terminated and :class:`RankFailed` carries
    the failing rank's exception type, message and traceback; no worker process outlives the call."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    for key, value in NCCL_SAFE_ENV.items():  # the spawned ranks inherit this environment
        os.environ.setdefault(key, value)
    log_dir = tempfile.mkdtemp(prefix="specbench-ranks-")  # each rank's error file, read when one fails
    config = LaunchConfig(
        logs_specs=DefaultLogsSpecs(log_dir=log_dir), min_nodes=1, max_nodes=1, nproc_per_node=world_size, run_id=f"specbench-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{port or free_port()}", max_restarts=0,
        monitor_interval=0.1, start_method=start_method,
    )
    try:
        returned = elastic_launch(config, _rank_main)(fn, tuple(args), backend)
    except ChildFailedError as error:
        raise _rank_failure(error, Path(log_dir)) from None
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    return [returned[rank] for rank in range(world_size)]


def _rank_failure(error, log_dir: Path) -> RankFailed:
    """The failure that caused the others. The launcher reports the first rank it saw exit, which may be a
    peer that only lost its connection to the failing rank; so every rank's error file is read, and ranks
    that only lost a peer go last, then the earliest."""
    described = {rank: (*_failure_text(f.message, f.exitcode), f.timestamp) for rank, f in error.failures.items()}
    for path in log_dir.glob("*/attempt_*/*/error.json"):
        record = json.loads(path.read_text()).get("message", {})
        rank = int(path.parent.name)
        if rank not in described or described[rank][0] == "ProcessExited":
            described[rank] = (*_failure_text(record, 1), int(record.get("extraInfo", {}).get("timestamp", 0) or 0))
    order = sorted(described, key=lambda r: (any(h in described[r][1] for h in PEER_LOSS_HINTS), described[r][3], r))
    error_type, message, traceback, _ = described[order[0]]
    others = tuple(f"rank {r}: {described[r][0]}: {described[r][1]}" for r in order[1:])
    return RankFailed(order[0], error_type, message, traceback, others)


def _failure_text(record, exitcode: int) -> tuple[str, str, str]:
    """(exception type, message, traceback) of a rank's error record (a dict), or of its exit (a string)."""
    if isinstance(record, dict):
        text = str(record.get("message", ""))
        traceback = str(record.get("extraInfo", {}).get("py_callstack", ""))
    else:
        text, traceback = str(record), ""
    error_type, sep, message = text.partition(": ")
    if not sep or " " in error_type:  # not "Type: message": a signal or an exit code
        return "ProcessExited", f"{text} (exit code {exitcode})", traceback
    return error_type, message, traceback


def environment_record(device: torch.device | str | None = None) -> dict:
    """World size, backend, every rank's device name and the interconnect, gathered from all ranks
    (a collective: every rank calls it); outside a process group, this one process's record."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    backend = dist.get_backend() if dist.is_initialized() else None
    mine = _device_name(device)
    names = [None] * world_size
    if dist.is_initialized():
        dist.all_gather_object(names, mine)
    else:
        names = [mine]
    cuda = device.type == "cuda"
    return {
        "world_size": world_size,
        "backend": backend,
        "device_names": names,
        "interconnect": _nvlink_state(device.index or 0) if cuda else f"none (CPU{f', {backend}' if backend else ''})",
        "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE") if cuda else None,
        "hardware_class": _hardware_class(names, world_size, cuda),
    }


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return gpu_name(device.index or 0) or "unknown GPU"
    import platform

    return platform.processor() or platform.machine() or "cpu"


def _hardware_class(names: list, world_size: int, cuda: bool) -> str:
    """"cpu" or the GPU model, prefixed with the GPU count when more than one takes part ("2x NVIDIA H200").
    CPU ranks stay "cpu" at any world size: they share one host's cores, as a single-process CPU run does."""
    gpu = names[0] if cuda and names and all(n == names[0] for n in names) else None
    single = hardware_class(gpu) if gpu else ("mixed GPUs" if cuda else "cpu")
    return single if world_size == 1 or single == "cpu" else f"{world_size}x {single}"


def _nvlink_state(index: int) -> str:
    """NVLink links active on CUDA device ``index`` as NVML reports them (the GPU named by its UUID, which
    CUDA_VISIBLE_DEVICES does not renumber); "unknown (...)" without an NVML answer."""
    def active_links(pynvml, handle) -> int:
        active = 0
        for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                active += pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED
            except pynvml.NVMLError:
                break
        return active

    active = nvml_query(nvidia_selector(index), active_links)
    if active is None:  # no pynvml, no driver, no NVLink API: say so rather than guess
        return "unknown (NVML unavailable)"
    return f"NVLink ({active} links active)" if active else "PCIe (no active NVLink)"