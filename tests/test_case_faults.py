"""Issue #13, faults: an out-of-memory or CUDA error in one case is that case's error (its message and the memory it
asked for), and the suite goes on, in the CLI and in pytest.

specbench.run.harness.run_case is replaced by a stand-in that raises for the chosen case ids and returns a synthetic
result (tests/_synthetic_results.py) for the others."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from _synthetic_results import make_result

from specbench.cli import main
from specbench.run.harness import case_fault, fault_line

pytest_plugins = ["pytester"]

OOM_MESSAGE = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which "
               "1.10 GiB is free.\nOf the allocated memory 130.00 GiB is allocated by PyTorch")
OOM_LINE = ("medusa/chain-k3: ERROR OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
            "total capacity of 139.80 GiB of which 1.10 GiB is free.")


@pytest.fixture(autouse=True)
def history_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_HISTORY_DIR", str(tmp_path / "history"))


@pytest.fixture()
def faulty_run(monkeypatch):
    """Replace run_case: raise ``state.raises[case_id]`` for those cases, a synthetic result for the others."""
    state = SimpleNamespace(cases=[], raises={})

    def run_case(case, *, progress=True, **_):
        state.cases.append(case.case_id)
        if case.case_id in state.raises:
            raise state.raises[case.case_id]
        result = make_result(num_requests=4, dtype=case.dtype, name=case.name, suite=case.suite, max_new_tokens=16)
        result["case"] = case.to_dict()
        return SimpleNamespace(to_dict=lambda: result)

    monkeypatch.setattr("specbench.run.harness.run_case", run_case)
    return state


def test_classifies_device_faults_only():
    oom = case_fault(torch.OutOfMemoryError(OOM_MESSAGE))
    assert oom == {"type": "OutOfMemoryError", "message": OOM_LINE.split(": ERROR OutOfMemoryError: ")[1],
                   "requested": "2.00 GiB"}
    assert torch.cuda.OutOfMemoryError is torch.OutOfMemoryError
    assert case_fault(RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors")) == {
        "type": "RuntimeError", "message": "CUDA error: an illegal memory access was encountered", "requested": None}
    assert case_fault(RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED when calling cublasGemmEx"))["requested"] is None
    assert case_fault(RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR"))["type"] == "RuntimeError"
    assert case_fault(RuntimeError("shape mismatch")) is None
    assert case_fault(ValueError("CUDA error")) is None
    assert fault_line("s/c", {"type": "OutOfMemoryError", "message": "", "requested": None}) == "s/c: ERROR OutOfMemoryError"


def test_an_oom_fails_only_its_case_and_the_suite_goes_on(faulty_run, tmp_path, capsys):
    faulty_run.raises["medusa/chain-k3"] = torch.OutOfMemoryError(OOM_MESSAGE)
    out = tmp_path / "r.json"
    assert main(["run", "medusa", "-k", "chain-k3,tree-63", "--no-gate", "--output", str(out)]) == 1
    assert faulty_run.cases == ["medusa/chain-k3", "medusa/tree-63"]  # the next case ran
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert OOM_LINE in lines and sum(": ERROR " in line for line in lines) == 1
    (row,) = [line for line in lines if line.startswith("medusa/chain-k3 ")]
    assert row.split()[1] == "ERROR" and row.endswith("ERROR OutOfMemoryError")
    assert any(line.startswith("medusa/tree-63 ") and line.endswith("exact") for line in lines)
    assert "medusa/tree-63: PASSED" in captured.out
    assert "not recorded in the results history (no metrics): medusa/chain-k3" in captured.err

    entries = json.loads(out.read_text())["results"]
    assert [e["case_id"] for e in entries] == ["medusa/chain-k3", "medusa/tree-63"]
    assert entries[0]["case"]["name"] == "chain-k3" and "metrics" not in entries[0]
    assert entries[0]["error"] == {"type": "OutOfMemoryError", "message": OOM_LINE.split(": ERROR OutOfMemoryError: ")[1],
                                   "requested": "2.00 GiB"}
    assert "error" not in entries[1] and entries[1]["metrics"]

    from specbench.gating.history import load_history

    assert load_history(tmp_path / "history")["case_id"].tolist() == ["medusa/tree-63"]  # the run with metrics only


def test_a_lone_faulted_case_writes_its_error_and_records_nothing(faulty_run, tmp_path, capsys):
    faulty_run.raises["medusa/chain-k3"] = RuntimeError("CUDA error: device-side assert triggered")
    out = tmp_path / "r.json"
    assert main(["run", "medusa/chain-k3", "--output", str(out)]) == 1
    assert "medusa/chain-k3: ERROR RuntimeError: CUDA error: device-side assert triggered" in capsys.readouterr().out
    assert json.loads(out.read_text())["error"]["requested"] is None
    assert not (tmp_path / "history").exists()


def test_other_errors_keep_todays_behaviour(faulty_run, capsys):
    faulty_run.raises["medusa/chain-k3"] = ValueError("bad input")
    assert main(["run", "medusa/chain-k3", "--no-history"]) == 2  # bad input, one line
    assert capsys.readouterr().err.strip() == "specbench: error: bad input"
    faulty_run.raises["medusa/chain-k3"] = RuntimeError("a bug")
    with pytest.raises(RuntimeError, match="a bug"):
        main(["run", "medusa/chain-k3", "--no-history"])


FAULTY_TESTS = """
import sys
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, {tests_dir!r})
from _synthetic_results import make_result


@pytest.fixture(autouse=True)
def faulty_run(monkeypatch):  # autouse: set up before specbench_run imports run_case
    def run_case(case, *, progress=True, **_):
        if case.name == "first":
            raise {error}
        result = make_result(num_requests=4, name=case.name, suite="cli", max_new_tokens=16)
        return SimpleNamespace(to_dict=lambda: result)

    monkeypatch.setattr("specbench.run.harness.run_case", run_case)


@pytest.mark.parametrize("name", ["first", "second"])
def test_case(specbench_run, name):
    specbench_run({{"name": name, "suite": "cli", "prompts": {{"name": "synthetic"}}}})
"""


def run_faulty_session(pytester, request, error: str):
    """An inner pytest session of FAULTY_TESTS whose "first" case raises ``error`` (Python source)."""
    pytester.makepyfile(test_faulty=FAULTY_TESTS.format(tests_dir=str(request.path.parent), error=error))
    return pytester.runpytest("-p", "no:randomly", "-p", "no:cacheprovider", "--specbench-no-history",
                              "--specbench-baselines", str(pytester.path / "baselines"))


def test_pytest_an_oom_fails_its_test_in_one_line_and_the_next_passes(pytester, request):
    result = run_faulty_session(pytester, request, f"torch.OutOfMemoryError({OOM_MESSAGE!r})")
    result.assert_outcomes(failed=1, passed=1)
    line = "cli/first: ERROR OutOfMemoryError: " + OOM_LINE.split(": ERROR OutOfMemoryError: ")[1]
    text = result.stdout.str()
    assert line in text.splitlines()  # the one line, not a traceback
    assert "Traceback" not in text and "run_case" not in text
    assert "Tried to allocate 2.00 GiB" in text
    result.stdout.fnmatch_lines(["FAILED test_faulty.py::test_case[[]first[]] - Failed: cli/first: ERROR *",
                                 "*1 failed, 1 passed*"])
    result.stdout.fnmatch_lines(["cli/first * ERROR * -  *", "cli/second * pass *"])  # the session table


CACHE_MESSAGE = ("batch_size 64 needs a static KV cache of 123456789 bytes (64 slots x 2048 positions) but cuda:0 has "
                 "1000 bytes free; lower batch_size (at most 0 fit at this length)")


def test_pytest_a_batched_cache_that_cannot_fit_fails_its_test_in_one_line(pytester, request):
    """check_cache_fits raises a MemoryError (not a RuntimeError) before allocating: still the case's one-line fault."""
    result = run_faulty_session(pytester, request, f"MemoryError({CACHE_MESSAGE!r})")
    result.assert_outcomes(failed=1, passed=1)
    assert f"cli/first: ERROR MemoryError: {CACHE_MESSAGE}" in result.stdout.str().splitlines()
    assert "Traceback" not in result.stdout.str()
