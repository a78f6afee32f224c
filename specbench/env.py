"""The environment fingerprint stored with every run, because speedups do not reproduce when the GPU,
driver, CUDA, library versions, dtype or commit went unrecorded. Reads, never loads.

torch is imported inside the functions that ask it about devices, never at module level: the pytest plugin
imports this module in every pytest process, and most of those never touch a GPU (a cold torch import is
over a second on a shared CPU box)."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

import specbench

FINGERPRINT_KEYS = (
    "python", "python_implementation", "platform", "machine", "cpu_model", "cpu_count",
    "torch", "transformers", "datasets", "specbench",
    "cuda_available", "cuda_version", "cudnn_version", "gpu_count", "gpu_name",
    "gpu_memory_bytes", "gpu_memory_gib", "driver_version",
    "device", "dtype", "git_commit", "git_dirty", "hardware_class",
)
_PROJECT_ROOT = Path(specbench.__file__).resolve().parent.parent
_COMMAND_TIMEOUT_S = 10


def environment_fingerprint(device: str | None = None, dtype: str | None = None) -> dict:
    """Facts that decide whether two runs' speeds are comparable; no hostname, user or path.
    ``device`` ("cpu", "cuda", "cuda:1"; None = the first GPU if any, recorded as resolved) picks
    the GPU described; ``dtype`` is recorded as "bfloat16" whether given as a string or a torch.dtype."""
    import torch

    gpu_index = _gpu_index(device)
    if gpu_index is not None:
        device = f"cuda:{gpu_index}"  # "cuda" alone would not say which GPU was described
    elif device is None:
        device = "cpu"
    gpu_name = _gpu_name(gpu_index) if gpu_index is not None else None
    memory_bytes = _gpu_memory_bytes(gpu_index) if gpu_index is not None else None
    commit, dirty = _git_state()
    return {
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),  # OS, kernel and libc; holds no hostname
        "machine": platform.machine(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": _distribution_version("transformers"),
        "datasets": _distribution_version("datasets"),
        "specbench": specbench.__version__,
        "cuda_available": _cuda_available(),
        "cuda_version": torch.version.cuda,  # the CUDA torch was built against
        "cudnn_version": _cudnn_version(),
        "gpu_count": torch.cuda.device_count() if _cuda_available() else 0,
        "gpu_name": gpu_name,
        "gpu_memory_bytes": memory_bytes,
        "gpu_memory_gib": memory_bytes / 2**30 if memory_bytes is not None else None,
        "driver_version": _driver_version(gpu_index) if gpu_index is not None else None,
        "device": device,
        "dtype": _dtype_name(dtype),
        "git_commit": commit,
        "git_dirty": dirty,
        "hardware_class": hardware_class(gpu_name),
    }


def gpu_memory_gib(index: int = 0) -> float | None:
    """Total memory of CUDA device ``index`` in binary GiB (2**30 bytes), None without that GPU.
    (vLLM's large_gpu mark divides by 1e9 instead; 24 GB there is 22.35 GiB here.)"""
    memory_bytes = _gpu_memory_bytes(index)
    return memory_bytes / 2**30 if memory_bytes is not None else None


def gpu_inventory() -> list[tuple[str, float]]:
    """(name, total GiB) of each visible CUDA device; empty without CUDA."""
    if not _cuda_available():
        return []
    import torch

    return [(_gpu_name(i) or f"cuda:{i}", gpu_memory_gib(i) or 0.0) for i in range(torch.cuda.device_count())]


def gpu_shortfall(min_gib: float, gpus: list[tuple[str, float]]) -> str | None:
    """Why device 0 of ``gpus`` cannot hold ``min_gib`` GiB ("no CUDA device", "needs ... found ..."), or None."""
    if not gpus:
        return "no CUDA device"
    name, gib = gpus[0]
    return f"needs {min_gib} GiB, found {gib:.1f} GiB on {name}" if gib < min_gib else None


def hardware_class(gpu_name: str | None) -> str:
    """"cpu", or the GPU model as the driver names it with whitespace collapsed. Memory and
    form-factor suffixes stay ("NVIDIA A100-SXM4-40GB" vs "-80GB"): their bandwidths differ, so
    their latency baselines must too."""
    if not gpu_name or not gpu_name.strip():
        return "cpu"
    return re.sub(r"\s+", " ", gpu_name).strip()


def _cuda_available() -> bool:
    import torch

    try:
        return torch.cuda.is_available()
    except Exception:  # a broken driver install must not stop the run from being recorded
        return False


def _gpu_index(device: str | None) -> int | None:
    import torch

    parsed = torch.device(device) if device is not None else None  # a malformed name raises here
    if (parsed is not None and parsed.type != "cuda") or not _cuda_available():
        return None
    if parsed is None or parsed.index is None:
        return torch.cuda.current_device()
    return parsed.index


def _gpu_name(index: int) -> str | None:
    import torch

    try:
        return torch.cuda.get_device_name(index)
    except Exception:
        return None


def _gpu_memory_bytes(index: int) -> int | None:
    import torch

    if not _cuda_available() or not 0 <= index < torch.cuda.device_count():
        return None
    try:
        return int(torch.cuda.get_device_properties(index).total_memory)
    except Exception:
        return None


def _cudnn_version() -> int | None:
    import torch

    try:
        return torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:
        return None


def _driver_version(index: int) -> str | None:
    """From nvidia-smi when it is installed; torch does not expose the driver version."""
    if shutil.which("nvidia-smi") is None:
        return None
    # CUDA_VISIBLE_DEVICES renumbers devices for torch but not for nvidia-smi; the driver is one
    # per host, so the first line answers for every index
    output = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return output.splitlines()[0].strip() if output else None


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if platform.system() == "Darwin":
        return _run(["sysctl", "-n", "machdep.cpu.brand_string"]) or platform.processor() or None
    return platform.processor() or None


def _distribution_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _dtype_name(dtype) -> str | None:
    if dtype is None:
        return None
    return str(dtype).removeprefix("torch.")  # torch.bfloat16 and "bfloat16" record the same


def _git_state() -> tuple[str | None, bool | None]:
    """(HEAD commit, tracked files modified) of the checkout specbench runs from; (None, None)
    when specbench is installed elsewhere, so an enclosing repository is never reported."""
    toplevel = _run(["git", "-C", str(_PROJECT_ROOT), "rev-parse", "--show-toplevel"])
    if not toplevel or Path(toplevel).resolve() != _PROJECT_ROOT:
        return None, None
    commit = _run(["git", "-C", str(_PROJECT_ROOT), "rev-parse", "HEAD"])
    if not commit:  # a repository without commits
        return None, None
    # untracked files are not counted, as `git describe --dirty` does not count them
    status = _run(["git", "-C", str(_PROJECT_ROOT), "status", "--porcelain", "--untracked-files=no"])
    return commit, (bool(status) if status is not None else None)


def _run(command: list[str]) -> str | None:
    """Stripped stdout of a read-only command, None when it is missing, fails or hangs."""
    # GIT_OPTIONAL_LOCKS=0 keeps `git status` from rewriting the index of the checkout it reads
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=_COMMAND_TIMEOUT_S, env=env)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None
