"""GPU clocks in the environment fingerprint, read through fake NVML and nvidia-smi, and the clock-difference note."""

from __future__ import annotations

import subprocess
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from specbench import env
from specbench.env import GPU_CLOCK_KEYS, environment_fingerprint, gpu_clocks
from specbench.gating.clocks import clock_difference

SMI_LINE = "1980, 1980, 2619, 2619, 71.23, 700.00, P0, 34, 0x0000000000000001"


@pytest.fixture
def smi(monkeypatch):
    """nvidia-smi installed, pynvml not importable, no CUDA in torch; ``smi.reply`` is what the fake prints
    (an exception instance is raised instead), ``smi.calls`` the (command, timeout) pairs it was run with."""
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    monkeypatch.setattr(env, "_cuda_available", lambda: False)
    monkeypatch.setattr(env.shutil, "which", lambda name: f"/usr/bin/{name}")
    state = SimpleNamespace(reply=SMI_LINE + "\n", returncode=0, calls=[])

    def fake_run(command, capture_output, text, timeout, env):
        state.calls.append((command, timeout))
        if isinstance(state.reply, BaseException):
            raise state.reply
        return subprocess.CompletedProcess(command, state.returncode, stdout=state.reply, stderr="")

    monkeypatch.setattr(env.subprocess, "run", fake_run)
    return state


def test_nvidia_smi_line_is_parsed(smi):
    clocks = gpu_clocks(1)
    assert clocks == {
        "sm_clock_mhz": 1980, "sm_clock_max_mhz": 1980, "memory_clock_mhz": 2619, "memory_clock_max_mhz": 2619,
        "power_draw_w": 71.23, "power_limit_w": 700.0, "pstate": "P0", "temperature_c": 34,
        "throttle_reasons": ["gpu_idle"], "source": "nvidia-smi",
    }
    (command, timeout), = smi.calls
    assert command[:2] == ["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.draw,"
                           "power.limit,pstate,temperature.gpu,clocks_throttle_reasons.active"]
    assert command[2:] == ["--format=csv,noheader,nounits", "-i", "1"] and timeout == 2


def test_nvidia_smi_unsupported_fields_are_none(smi):
    smi.reply = "1410, [N/A], 1593, [Not Supported], [N/A], [N/A], P2, 40, [Not Supported]\n"
    clocks = gpu_clocks()
    assert (clocks["sm_clock_mhz"], clocks["memory_clock_mhz"], clocks["pstate"]) == (1410, 1593, "P2")
    for key in ("sm_clock_max_mhz", "memory_clock_max_mhz", "power_draw_w", "power_limit_w", "throttle_reasons"):
        assert clocks[key] is None, key
    smi.reply = ", ".join(["[N/A]"] * len(GPU_CLOCK_KEYS))
    assert gpu_clocks() is None  # nothing was read at all


def test_nvidia_smi_throttle_bitmask_with_two_reasons(smi):
    smi.reply = SMI_LINE.replace("0x0000000000000001", "0x0000000000000044")
    assert gpu_clocks()["throttle_reasons"] == ["sw_power_cap", "hw_thermal_slowdown"]
    smi.reply = SMI_LINE.replace("0x0000000000000001", "0x0000000000000000")
    assert gpu_clocks()["throttle_reasons"] == []  # known and none active, unlike None (unknown)


def test_throttle_reason_names_cover_every_bit():
    assert env.throttle_reason_names(0xFF) == [
        "gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "sync_boost",
        "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"]
    assert env.throttle_reason_names(0x201) == ["gpu_idle", "0x200"]
    assert env.throttle_reason_names(None) is None


@pytest.mark.parametrize("failure", ["timeout", "missing", "exit", "garbled"])
def test_nvidia_smi_failures_give_none(smi, monkeypatch, failure):
    if failure == "timeout":
        smi.reply = subprocess.TimeoutExpired("nvidia-smi", 2)
    elif failure == "missing":  # on PATH once, gone when run
        smi.reply = FileNotFoundError("nvidia-smi")
    elif failure == "exit":  # "No devices were found"
        smi.returncode = 6
    else:
        smi.reply = "1980, 1980\n"
    assert gpu_clocks() is None


def test_no_nvidia_smi_binary_gives_none(smi, monkeypatch):
    monkeypatch.setattr(env.shutil, "which", lambda name: None)
    assert gpu_clocks() is None and smi.calls == []


class _NotSupported(Exception):
    pass


def _fake_pynvml(calls: list, *, init_fails: bool = False) -> types.ModuleType:
    """A pynvml module answering for one H200-like GPU; the power draw is unsupported."""
    nvml = types.ModuleType("pynvml")
    nvml.NVML_CLOCK_SM, nvml.NVML_CLOCK_MEM, nvml.NVML_TEMPERATURE_GPU = 1, 2, 0
    current, maximum = {1: 1410, 2: 2619}, {1: 1980, 2: 2619}

    def init():
        calls.append("init")
        if init_fails:
            raise _NotSupported("driver not loaded")

    def unsupported(handle):
        raise _NotSupported

    nvml.nvmlInit, nvml.nvmlShutdown = init, lambda: calls.append("shutdown")
    nvml.nvmlDeviceGetHandleByIndex = lambda i: calls.append(("index", i)) or "handle"
    nvml.nvmlDeviceGetHandleByUUID = lambda uuid: calls.append(("uuid", uuid)) or "handle"
    nvml.nvmlDeviceGetClockInfo = lambda h, kind: current[kind]
    nvml.nvmlDeviceGetMaxClockInfo = lambda h, kind: maximum[kind]
    nvml.nvmlDeviceGetPowerUsage = unsupported
    nvml.nvmlDeviceGetPowerManagementLimit = lambda h: 700000  # milliwatts
    nvml.nvmlDeviceGetPerformanceState = lambda h: 2
    nvml.nvmlDeviceGetTemperature = lambda h, sensor: 51
    nvml.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: 0x4 | 0x1  # an older pynvml: no ClocksEvent name
    return nvml


def test_nvml_path_reads_the_fake_module(monkeypatch):
    calls: list = []
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(calls))
    monkeypatch.setattr(env, "_cuda_available", lambda: False)
    monkeypatch.setattr(env.shutil, "which", lambda name: pytest.fail("nvidia-smi asked although NVML answered"))
    assert gpu_clocks(3) == {
        "sm_clock_mhz": 1410, "sm_clock_max_mhz": 1980, "memory_clock_mhz": 2619, "memory_clock_max_mhz": 2619,
        "power_draw_w": None, "power_limit_w": 700.0, "pstate": "P2", "temperature_c": 51,
        "throttle_reasons": ["gpu_idle", "sw_power_cap"], "source": "nvml",
    }
    assert calls == ["init", ("index", 3), "shutdown"]


def test_nvml_names_the_gpu_by_torch_uuid(monkeypatch):
    # CUDA_VISIBLE_DEVICES=3 makes physical GPU 3 torch's cuda:0; NVML's index 0 would be another GPU
    calls: list = []
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(calls))
    monkeypatch.setattr(env, "_cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid="58a4f9b0-0000-1111"))
    assert gpu_clocks(0)["source"] == "nvml"
    assert ("uuid", b"GPU-58a4f9b0-0000-1111") in calls


def test_nvml_without_a_driver_falls_back_to_nvidia_smi(smi, monkeypatch):
    calls: list = []
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(calls, init_fails=True))
    assert gpu_clocks()["source"] == "nvidia-smi"
    monkeypatch.setattr(env.shutil, "which", lambda name: None)
    assert gpu_clocks() is None  # neither answers: no driver at all


def _env(**clocks) -> dict:
    base = {"sm_clock_mhz": 1980, "sm_clock_max_mhz": 1980, "memory_clock_mhz": 2619, "memory_clock_max_mhz": 2619,
            "power_draw_w": 500.0, "power_limit_w": 700.0, "pstate": "P0", "temperature_c": 60,
            "throttle_reasons": [], "source": "nvml"}
    return {"hardware_class": "NVIDIA H200", "gpu_clocks": {**base, **clocks}}


def test_clock_difference_equal_or_within_tolerance_is_none():
    assert clock_difference(_env(), _env()) is None
    # 3% lower, gpu_idle appearing, another temperature or power draw: all still comparable
    assert clock_difference(_env(sm_clock_mhz=1920, throttle_reasons=["gpu_idle"], temperature_c=80,
                                 power_draw_w=650.0), _env()) is None


def test_clock_difference_names_both_sm_clocks():
    note = clock_difference(_env(sm_clock_mhz=1386), _env())  # 30% lower
    assert note == "GPU clocks differ from the baseline's: SM 1386 MHz vs 1980 MHz; speed figures are not comparable"
    assert clock_difference(_env(sm_clock_mhz=1386), _env(), tolerance=0.5) is None


def test_clock_difference_memory_clock_and_pstate():
    note = clock_difference(_env(sm_clock_mhz=1410, pstate="P2"), _env())
    assert note == ("GPU clocks differ from the baseline's: SM 1410 MHz vs 1980 MHz, pstate P2 vs P0; "
                    "speed figures are not comparable")
    assert "memory 1593 MHz vs 2619 MHz" in clock_difference(_env(memory_clock_mhz=1593), _env())
    assert clock_difference(_env(pstate="P2"), _env()).count("pstate P2 vs P0") == 1


def test_clock_difference_new_throttle_reason():
    note = clock_difference(_env(throttle_reasons=["gpu_idle", "sw_power_cap"]), _env())
    assert note and "sw_power_cap" in note and "gpu_idle" not in note
    # the baseline was power-capped too: nothing changed
    assert clock_difference(_env(throttle_reasons=["sw_power_cap"]), _env(throttle_reasons=["sw_power_cap"])) is None
    assert clock_difference(_env(throttle_reasons=["sw_power_cap"]), _env(throttle_reasons=None)) is None


def test_clock_difference_is_silent_when_either_side_lacks_clocks():
    slow = _env(sm_clock_mhz=900, pstate="P8")
    old_baseline = {"hardware_class": "NVIDIA H200"}  # recorded before clocks were
    assert clock_difference(slow, old_baseline) is None
    assert clock_difference(old_baseline, slow) is None
    assert clock_difference({"gpu_clocks": None}, slow) is None and clock_difference(slow, {}) is None
    # one field unknown on one side: the others still count
    assert clock_difference(_env(sm_clock_mhz=None, pstate="P2"), _env()).count("SM") == 0


def test_cpu_fingerprint_has_no_clocks(monkeypatch):
    monkeypatch.setattr(env, "gpu_clocks", lambda index=0: pytest.fail("clocks read for a CPU device"))
    fingerprint = environment_fingerprint(device="cpu")
    assert "gpu_clocks" in fingerprint and fingerprint["gpu_clocks"] is None  # present as None, like gpu_name


def test_cuda_fingerprint_samples_clocks_of_its_device(monkeypatch):
    monkeypatch.setattr(env, "_gpu_index", lambda device: 1)
    monkeypatch.setattr(env, "gpu_clocks", lambda index=0: {"sm_clock_mhz": 1980, "index": index})
    fingerprint = environment_fingerprint(device="cuda:1")
    assert fingerprint["device"] == "cuda:1" and fingerprint["gpu_clocks"] == {"sm_clock_mhz": 1980, "index": 1}
