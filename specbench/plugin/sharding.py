"""The pytest plugin's GPU sharding under pytest-xdist: each worker's GPUs, the controller's plan and summary (docs/tensor_parallel.md)."""

from __future__ import annotations

import os
import sys

import pytest

from specbench import env
from specbench.plugin import gpu_assignment as gpus_of

ASSIGNMENT_KEY = pytest.StashKey[dict]()  # on an xdist worker: its id, CUDA_VISIBLE_DEVICES, whether specbench set it
PLAN_KEY = pytest.StashKey[dict]()  # on the xdist controller: the workers, the GPUs they share, sharding on or off
WORKERS_KEY = pytest.StashKey[list]()  # on the xdist controller: each finished worker's assignment


def sharding_off(config: pytest.Config) -> bool:
    return config.getoption("--specbench-no-gpu-sharding") or gpus_of.opted_out(os.environ.get(gpus_of.OPT_OUT_VAR))


def _cuda_initialised() -> bool:
    """Whether this process already initialised CUDA through torch (after that CUDA_VISIBLE_DEVICES is not read)."""
    torch = sys.modules.get("torch")  # never imported here: a process without torch has not initialised CUDA through it
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:
        return False


def assign_worker_gpus(config: pytest.Config) -> None:
    """On xdist worker gwk: CUDA_VISIBLE_DEVICES = the controller's GPU list rotated to start at GPU k mod G."""
    worker = os.environ.get(gpus_of.WORKER_VAR)
    if worker is None:
        return
    gpus = config.workerinput.get("specbench_gpus")
    note = None
    if sharding_off(config):
        note = "GPU sharding off"
    elif not gpus:
        note = "no GPU visible"
    elif _cuda_initialised():
        note = "CUDA was already initialised in this worker: CUDA_VISIBLE_DEVICES left as it was"
        config.issue_config_time_warning(pytest.PytestWarning(
            f"specbench: {worker}: {note} (a conftest or plugin touched torch.cuda before specbench's "
            "pytest_configure), so this worker may share a GPU with another"), stacklevel=2)
    else:
        try:
            order = gpus_of.device_order(worker, os.environ.get(gpus_of.WORKER_COUNT_VAR, ""), gpus)
        except gpus_of.GpuAssignmentError as err:
            raise pytest.UsageError(f"specbench GPU sharding: {err}") from None
        os.environ[gpus_of.VISIBLE_DEVICES_VAR] = ",".join(order)
    visible = os.environ.get(gpus_of.VISIBLE_DEVICES_VAR)
    config.stash[ASSIGNMENT_KEY] = {"worker": worker, "cuda_visible_devices": visible, "sharded": note is None,
                                    "note": note}


def sharding_plan(config: pytest.Config, workers: int) -> dict:
    """The controller's plan, made once (pytest_xdist_setupnodes, before any worker starts): the GPUs the workers
    share (None when sharding is off) and the worker count."""
    plan = config.stash.get(PLAN_KEY, None)
    if plan is None:
        gpus = None
        if not sharding_off(config):
            visible = os.environ.get(gpus_of.VISIBLE_DEVICES_VAR)
            try:  # the inventory (a torch import) only when CUDA_VISIBLE_DEVICES does not already list the GPUs
                gpus = gpus_of.visible_gpus(visible, len(env.gpu_inventory()) if visible is None else 0)
            except gpus_of.GpuAssignmentError as err:
                raise pytest.UsageError(f"specbench GPU sharding: {err} (or pass --specbench-no-gpu-sharding)") from None
        plan = config.stash[PLAN_KEY] = {"workers": workers, "gpus": gpus}
    return plan


def announce_plan(config: pytest.Config, workers: int) -> None:
    """Controller, before the workers start (pytest_xdist_setupnodes): list the GPUs once, say how they are shared."""
    plan = sharding_plan(config, workers)
    if not plan["gpus"]:
        return
    count = len(plan["gpus"])
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"specbench: {plan['workers']} xdist workers on GPU{'s' if count > 1 else ''} "
                            f"{','.join(plan['gpus'])}: worker gwk sees GPU k mod {count} first "
                            f"(--specbench-no-gpu-sharding turns this off)")
    note = gpus_of.sharing_note(plan["workers"], count)
    if note:
        config.issue_config_time_warning(pytest.PytestWarning(f"specbench: {note}"), stacklevel=2)


def write_summary(terminalreporter, config: pytest.Config, plan: dict, wall: float) -> None:
    """The controller's last lines: each worker's CUDA_VISIBLE_DEVICES (when sharded), the wall time, workers and GPUs."""
    sharded = bool(plan["gpus"])
    gpus = "no GPU sharding"
    if sharded:
        terminalreporter.section("specbench: GPU sharding")
        for assignment in sorted(config.stash.get(WORKERS_KEY, []), key=lambda a: _worker_sort_key(a["worker"])):
            terminalreporter.write_line(f"{assignment['worker']}: CUDA_VISIBLE_DEVICES="
                                        f"{assignment['cuda_visible_devices']}"
                                        + (f" ({assignment['note']})" if assignment["note"] else ""))
        shared = gpus_of.sharing_note(plan["workers"], len(plan["gpus"]))
        count = len(plan["gpus"])
        gpus = f"{count} GPU{'s' if count > 1 else ''} ({','.join(plan['gpus'])})"
        gpus += ", shared round-robin" if shared else ""
    terminalreporter.write_line(f"wall time {wall:.1f} s, {plan['workers']} xdist workers, {gpus}")


def _worker_sort_key(worker: str) -> tuple:
    try:
        return (0, gpus_of.worker_index(worker))
    except gpus_of.GpuAssignmentError:
        return (1, worker)
