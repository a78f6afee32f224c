"""Sharded GPU suites under pytest-xdist: which GPUs each worker sees, and an inner ``-n 2`` session that sets them."""

from __future__ import annotations

import json
import sys
import types

import pytest

from specbench.plugin import sharding
from specbench.plugin.gpu_assignment import (GpuAssignmentError, device_order, opted_out, parse_visible_devices,
                                             sharing_note, visible_gpus, worker_index)
from test_pytest_plugin import fake_gpus

pytest_plugins = ["pytester"]


def orders(workers: int, gpus: list[str]) -> list[str]:
    return [",".join(device_order(f"gw{k}", str(workers), gpus)) for k in range(workers)]


def test_four_workers_on_four_gpus_each_get_their_own_first():
    assert orders(4, visible_gpus(None, 4)) == ["0,1,2,3", "1,2,3,0", "2,3,0,1", "3,0,1,2"]


def test_eight_workers_on_four_gpus_share_them_round_robin():
    assert orders(8, visible_gpus(None, 4)) == ["0,1,2,3", "1,2,3,0", "2,3,0,1", "3,0,1,2"] * 2
    assert "8 xdist workers share 4 GPUs round-robin" in sharing_note(8, 4)
    assert sharing_note(4, 4) is None and sharing_note(2, 0) is None


def test_two_workers_on_one_gpu_both_see_it():
    assert orders(2, visible_gpus(None, 1)) == ["0", "0"]
    assert "share 1 GPU round-robin" in sharing_note(2, 1)


def test_cuda_visible_devices_is_the_list_the_workers_share():
    assert visible_gpus("3,5", inventory_count=8) == ["3", "5"]  # the variable, not the inventory
    assert orders(2, visible_gpus("3,5")) == ["3,5", "5,3"]
    assert orders(3, visible_gpus(" 3, 5 ")) == ["3,5", "5,3", "3,5"]
    assert parse_visible_devices("GPU-1a2b,MIG-3c4d") == ["GPU-1a2b", "MIG-3c4d"]
    assert visible_gpus("") == [] and orders(2, []) == ["", ""]  # "" hides every GPU


def test_a_multi_gpu_case_uses_its_workers_gpu_and_the_next_ones():
    order = device_order("gw2", "4", visible_gpus(None, 4))
    assert order[:2] == ["2", "3"] and sorted(order) == ["0", "1", "2", "3"]


def test_a_restarted_worker_beyond_the_count_still_gets_gpus():
    """xdist names the replacement of a crashed worker with the next free id, past the worker count."""
    assert device_order("gw4", "4", ["0", "1"]) == ["0", "1"] and device_order("gw5", "4", ["0", "1"]) == ["1", "0"]


@pytest.mark.parametrize("worker, count, message", [
    ("gw", "2", "PYTEST_XDIST_WORKER='gw' is not an xdist worker id of the form gwN"),
    ("master", "2", "PYTEST_XDIST_WORKER='master' is not an xdist worker id"),
    ("gw-1", "2", "PYTEST_XDIST_WORKER='gw-1' is not"),
    ("gw1", "two", "PYTEST_XDIST_WORKER_COUNT='two' is not a positive number of xdist workers"),
    ("gw0", "0", "PYTEST_XDIST_WORKER_COUNT='0' is not a positive number"),
])
def test_malformed_worker_values_name_the_variable_and_value(worker, count, message):
    with pytest.raises(GpuAssignmentError, match=message.replace("(", r"\(").replace(")", r"\)")):
        device_order(worker, count, ["0", "1"])


@pytest.mark.parametrize("value, message", [
    ("0,,1", "CUDA_VISIBLE_DEVICES='0,,1' has an empty entry"),
    ("1,1", "CUDA_VISIBLE_DEVICES='1,1' names 1 more than once"),
])
def test_malformed_cuda_visible_devices_is_an_error(value, message):
    with pytest.raises(GpuAssignmentError, match=message):
        visible_gpus(value)


def test_worker_index_and_opt_out_values():
    assert worker_index("gw12") == 12
    assert [opted_out(v) for v in (None, "", "0", "1", "yes")] == [False, False, False, True, True]


class _WorkerConfig:
    """The parts of a worker's pytest.Config that the plugin's assignment reads."""

    def __init__(self, gpus):
        self.workerinput = {"specbench_gpus": gpus}
        self.stash = pytest.Stash()
        self.warnings = []

    def getoption(self, name):
        assert name == "--specbench-no-gpu-sharding"
        return False

    def issue_config_time_warning(self, warning, stacklevel):
        self.warnings.append(str(warning))


def _torch_stub(initialised: bool):
    return types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: initialised))


def test_a_worker_that_already_initialised_cuda_warns_and_keeps_its_devices(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.delenv("SPECBENCH_NO_GPU_SHARDING", raising=False)
    monkeypatch.setitem(sys.modules, "torch", _torch_stub(initialised=True))
    config = _WorkerConfig(["0", "1"])
    sharding.assign_worker_gpus(config)
    assert config.stash[sharding.ASSIGNMENT_KEY]["cuda_visible_devices"] == "0,1"
    assert len(config.warnings) == 1 and "CUDA was already initialised in this worker" in config.warnings[0]

    monkeypatch.setitem(sys.modules, "torch", _torch_stub(initialised=False))
    config = _WorkerConfig(["0", "1"])
    sharding.assign_worker_gpus(config)  # not yet initialised: gw1's own GPU first
    assert config.stash[sharding.ASSIGNMENT_KEY] == {"worker": "gw1", "cuda_visible_devices": "1,0",
                                                          "sharded": True, "note": None}
    assert config.warnings == []


SHARDED_CASES = """
import os
import sys
import pytest
sys.path.insert(0, {tests_dir!r})
from _synthetic_results import make_result

@pytest.mark.multi_gpu(2)
@pytest.mark.parametrize("index", range(4))
def test_case(index, specbench_gate):
    specbench_gate(make_result(seed=index, num_requests=4, name=f"case-{{index}}"))
"""


@pytest.mark.parametrize("visible, extra, expected", [
    (None, [], {"gw0": "0,1", "gw1": "1,0"}),  # from the (fake) inventory
    ("3,5", [], {"gw0": "3,5", "gw1": "5,3"}),  # from CUDA_VISIBLE_DEVICES
    ("3,5", ["--specbench-no-gpu-sharding"], {"gw0": "3,5", "gw1": "3,5"}),  # opted out: left alone
])
def test_two_xdist_workers_get_their_own_gpus_and_merge_their_results(pytester, request, monkeypatch, visible, extra,
                                                                      expected):
    """An inner ``-n 2`` session on two fake GPUs: every result names its worker and the devices it saw; both
    workers' results land in one results file and one history, and the controller's summary lists them all."""
    from specbench.gating.history import load_history

    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.delenv("SPECBENCH_NO_GPU_SHARDING", raising=False)
    fake_gpus(pytester, [("NVIDIA FakeGPU", 80.0), ("NVIDIA FakeGPU", 80.0)])
    pytester.makepyfile(test_sharded=SHARDED_CASES.format(tests_dir=str(request.path.parent)))
    results, history = pytester.path / "results.jsonl", pytester.path / "history"
    outcome = pytester.runpytest_subprocess(
        "-n", "2", "-p", "no:cacheprovider", "-p", "no:randomly", "--specbench-baselines",
        str(pytester.path / "baselines"), "--specbench-results", str(results), "--specbench-history", str(history),
        *extra, timeout=300,
    )
    outcome.assert_outcomes(passed=4)
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert sorted(r["case_id"] for r in records) == [f"medusa/case-{i}" for i in range(4)]
    seen = {r["env"]["xdist_worker"]: r["env"]["cuda_visible_devices"] for r in records}
    assert seen == expected  # each worker recorded one CUDA_VISIBLE_DEVICES for all its cases
    assert len(load_history(history)) == 4
    stdout = outcome.stdout.str()
    assert stdout.count(" pass ") >= 4  # the workers' rows in the controller's table
    if extra:
        assert "specbench: GPU sharding" not in stdout
        outcome.stdout.fnmatch_lines(["wall time * s, 2 xdist workers, no GPU sharding"])
    else:
        assert seen["gw0"].split(",")[0] != seen["gw1"].split(",")[0]
        gpus = expected["gw0"]
        outcome.stdout.fnmatch_lines([f"specbench: 2 xdist workers on GPUs {gpus}: worker gwk sees GPU k mod 2 first*",
                                      "*specbench: GPU sharding*", f"gw0: CUDA_VISIBLE_DEVICES={expected['gw0']}",
                                      f"gw1: CUDA_VISIBLE_DEVICES={expected['gw1']}",
                                      f"wall time * s, 2 xdist workers, 2 GPUs ({gpus})"])


ONE_GPU_TESTS = """
import os

def test_sees_gpu_7():
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "7"

def test_again():
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "7"
"""


def test_more_workers_than_gpus_warn_once(pytester, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    monkeypatch.delenv("SPECBENCH_NO_GPU_SHARDING", raising=False)
    pytester.makepyfile(test_one=ONE_GPU_TESTS)
    outcome = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider", "-p", "no:randomly", timeout=300)
    outcome.assert_outcomes(passed=2)
    assert outcome.stdout.str().count("2 xdist workers share 1 GPU round-robin") == 1  # one warning, not per worker
    outcome.stdout.fnmatch_lines(["*specbench: 2 xdist workers share 1 GPU round-robin*",
                                  "wall time * s, 2 xdist workers, 1 GPU (7), shared round-robin"])
