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
from specbench.cpu_threads import thread_record

FINGERPRINT_KEYS = (
    "python", "python_implementation", "platform", "machine", "cpu_model", "cpu_count", "cpu_threads",
    "torch", "transformers", "datasets", "specbench",
    "cuda_available", "cuda_version", "cudnn_version", "gpu_count", "gpu_name",
    "gpu_memory_bytes", "gpu_memory_gib", "driver_version", "gpu_clocks",
    "device", "dtype", "git_commit", "git_dirty", "hardware_class",
)
# what a tensor-parallel run adds (distributed.environment_record); a single-process run's record has none of them
DISTRIBUTED_KEYS = ("world_size", "tensor_parallel", "backend", "device_names", "interconnect", "nccl_nvls_enable")
_PROJECT_ROOT = Path(specbench.__file__).resolve().parent.parent
_COMMAND_TIMEOUT_S = 10
_CLOCKS_TIMEOUT_S = 2  # a fingerprint is taken after every run; a hung driver must not hold it up
GPU_CLOCK_KEYS = (
    "sm_clock_mhz", "sm_clock_max_mhz", "memory_clock_mhz", "memory_clock_max_mhz",
    "power_draw_w", "power_limit_w", "pstate", "temperature_c", "throttle_reasons",
)
# bits of NVML's clocks-event (throttle) reason mask, in the order nvml.h defines them
THROTTLE_REASONS = (
    (0x1, "gpu_idle"), (0x2, "applications_clocks_setting"), (0x4, "sw_power_cap"), (0x8, "hw_slowdown"),
    (0x10, "sync_boost"), (0x20, "sw_thermal_slowdown"), (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"), (0x100, "display_clock_setting"),
)
# nvidia-smi's names for GPU_CLOCK_KEYS, in that order
_SMI_FIELDS = ("clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.draw,power.limit,pstate,temperature.gpu,"
               "clocks_throttle_reasons.active")


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
    name = gpu_name(gpu_index) if gpu_index is not None else None
    memory_bytes = _gpu_memory_bytes(gpu_index) if gpu_index is not None else None
    commit, dirty = _git_state()
    return {
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),  # OS, kernel and libc; holds no hostname
        "machine": platform.machine(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_threads": thread_record(),  # torch's intra-op threads, the load, oversubscription
        "torch": torch.__version__,
        "transformers": _distribution_version("transformers"),
        "datasets": _distribution_version("datasets"),
        "specbench": specbench.__version__,
        "cuda_available": _cuda_available(),
        "cuda_version": torch.version.cuda,  # the CUDA torch was built against
        "cudnn_version": _cudnn_version(),
        "gpu_count": torch.cuda.device_count() if _cuda_available() else 0,
        "gpu_name": name,
        "gpu_memory_bytes": memory_bytes,
        "gpu_memory_gib": memory_bytes / 2**30 if memory_bytes is not None else None,
        "driver_version": _driver_version(gpu_index) if gpu_index is not None else None,
        # sampled by this call, so a fingerprint taken right after the timed work says what it ran at
        "gpu_clocks": gpu_clocks(gpu_index) if gpu_index is not None else None,
        "device": device,
        "dtype": _dtype_name(dtype),
        "git_commit": commit,
        "git_dirty": dirty,
        "hardware_class": hardware_class(name),
    }


def with_distributed(fingerprint: dict, record: dict, tensor_parallel: int) -> dict:
    """``fingerprint`` (rank 0's) with a tensor-parallel run's fields: its world size and tensor-parallel size,
    backend, every rank's device name, the interconnect, and the hardware class counting the GPUs
    ("2x NVIDIA H200"; CPU ranks stay "cpu", so single-process classes and their baselines are unchanged)."""
    fields = {key: record.get(key) for key in DISTRIBUTED_KEYS if key != "tensor_parallel"}
    return {**fingerprint, **fields, "tensor_parallel": tensor_parallel, "hardware_class": record["hardware_class"]}


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

    return [(gpu_name(i) or f"cuda:{i}", gpu_memory_gib(i) or 0.0) for i in range(torch.cuda.device_count())]


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


def gpu_clocks(index: int = 0) -> dict | None:
    """Clocks, power, performance state, temperature and active throttle reasons of CUDA device
    ``index`` (torch's numbering) as they are now: the GPU_CLOCK_KEYS plus "source" ("nvml" or
    "nvidia-smi"). A field the GPU does not report is None; ``throttle_reasons`` is a list of names,
    [] when none is active. Read through NVML (pynvml, the ``gpu`` extra) when it imports, else
    nvidia-smi; None when neither answers (no GPU, no driver). Never raises."""
    try:
        selector = nvidia_selector(index)
        return _nvml_clocks(selector) or _smi_clocks(selector)
    except Exception:  # the fingerprint is taken after a finished run; it must not lose that run
        return None


def throttle_reason_names(mask: int | None) -> list[str] | None:
    """Names of the bits set in an NVML clocks-event (throttle) reason mask; None for None.
    A bit nvml.h did not define at the time of writing is named by its value ("0x200")."""
    if mask is None:
        return None
    known = [name for bit, name in THROTTLE_REASONS if mask & bit]
    defined = sum(bit for bit, _ in THROTTLE_REASONS)
    unknown = [f"0x{1 << n:x}" for n in range(64) if mask & ~defined & (1 << n)]
    return known + unknown


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


def gpu_name(index: int) -> str | None:
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


def nvidia_selector(index: int) -> str:
    """How NVML and nvidia-smi name CUDA device ``index``: its UUID where torch knows it, since
    CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER renumber devices for torch only; else the index."""
    if _cuda_available():
        import torch

        try:
            uuid = str(torch.cuda.get_device_properties(index).uuid)
        except Exception:
            uuid = ""
        if uuid:
            return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
    return str(index)


def nvml_query(selector: str, read):
    """``read(pynvml, handle)`` for the GPU ``selector`` names (``nvidia_selector``: a UUID, else an index),
    between nvmlInit and nvmlShutdown; None without pynvml, a driver or an answer."""
    try:
        import pynvml
    except Exception:  # not installed (the optional ``gpu`` extra) or broken
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver
        return None
    try:
        getter = pynvml.nvmlDeviceGetHandleByIndex if selector.isdigit() else pynvml.nvmlDeviceGetHandleByUUID
        return read(pynvml, getter(int(selector) if selector.isdigit() else selector.encode()))
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _nvml_clocks(selector: str) -> dict | None:
    """The clock record from NVML (nvidia-smi answers instead when this is None)."""
    return nvml_query(selector, lambda pynvml, handle: _clock_record(_nvml_fields(pynvml, handle), "nvml"))


def _nvml_fields(pynvml, handle) -> dict:
    def ask(name: str, *args):
        try:
            return getattr(pynvml, name)(handle, *args)
        except Exception:  # NVMLError_NotSupported and kin, or an older pynvml: that one field is unknown
            return None

    sm, mem = pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM
    power, limit = ask("nvmlDeviceGetPowerUsage"), ask("nvmlDeviceGetPowerManagementLimit")  # milliwatts
    pstate = ask("nvmlDeviceGetPerformanceState")
    reasons = ask("nvmlDeviceGetCurrentClocksEventReasons")  # the newer name of the throttle reasons
    if reasons is None:
        reasons = ask("nvmlDeviceGetCurrentClocksThrottleReasons")
    return {
        "sm_clock_mhz": ask("nvmlDeviceGetClockInfo", sm),
        "sm_clock_max_mhz": ask("nvmlDeviceGetMaxClockInfo", sm),
        "memory_clock_mhz": ask("nvmlDeviceGetClockInfo", mem),
        "memory_clock_max_mhz": ask("nvmlDeviceGetMaxClockInfo", mem),
        "power_draw_w": power / 1000 if power is not None else None,
        "power_limit_w": limit / 1000 if limit is not None else None,
        "pstate": f"P{pstate}" if isinstance(pstate, int) and 0 <= pstate <= 15 else None,  # 32: unknown
        "temperature_c": ask("nvmlDeviceGetTemperature", pynvml.NVML_TEMPERATURE_GPU),
        "throttle_reasons": throttle_reason_names(reasons),
    }


def _smi_clocks(selector: str) -> dict | None:
    if shutil.which("nvidia-smi") is None:
        return None
    command = ["nvidia-smi", f"--query-gpu={_SMI_FIELDS}", "--format=csv,noheader,nounits", "-i", selector]
    output = _run(command, timeout=_CLOCKS_TIMEOUT_S)
    if not output:
        return None
    values = [value.strip() for value in output.splitlines()[0].split(",")]
    if len(values) != len(GPU_CLOCK_KEYS):
        return None
    return _clock_record(dict(zip(GPU_CLOCK_KEYS, map(_smi_value, GPU_CLOCK_KEYS, values))), "nvidia-smi")


def _smi_value(key: str, text: str):
    """One nvidia-smi field as GPU_CLOCK_KEYS holds it; None for "[N/A]", "[Not Supported]" and the like."""
    if not text or text.startswith("[") or text.upper() in ("N/A", "NOT SUPPORTED", "UNKNOWN"):
        return None
    try:
        if key == "pstate":
            return text
        if key == "throttle_reasons":
            return throttle_reason_names(int(text, 16))
        number = float(text)
    except ValueError:
        return None
    return number if key.endswith("_w") else int(number)


def _clock_record(fields: dict, source: str) -> dict | None:
    """``fields`` with their NVML/nvidia-smi ``source``, None when not one field was read."""
    if all(fields.get(key) is None for key in GPU_CLOCK_KEYS):
        return None
    return {**{key: fields.get(key) for key in GPU_CLOCK_KEYS}, "source": source}


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


def _run(command: list[str], timeout: float = _COMMAND_TIMEOUT_S) -> str | None:
    """Stripped stdout of a read-only command, None when it is missing, fails or hangs."""
    # GIT_OPTIONAL_LOCKS=0 keeps `git status` from rewriting the index of the checkout it reads
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None
