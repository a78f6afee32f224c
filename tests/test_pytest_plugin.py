"""The pytest plugin, driven through pytester: markers, baseline updates, gates and the results file."""

from __future__ import annotations

import json

import pytest

pytest_plugins = ["pytester"]

FAKE_GPU_CONFTEST = """
import specbench.env as env

_saved = env.gpu_inventory

def pytest_configure(config):
    env.gpu_inventory = lambda: {gpus!r}

def pytest_unconfigure(config):  # pytester runs in-process: put the real one back
    env.gpu_inventory = _saved
"""

MARKED_TESTS = """
import pytest

@pytest.mark.large_gpu(min_gb=24)
def test_needs_24():
    pass

@pytest.mark.large_gpu(min_gb=8)
def test_needs_8():
    pass

@pytest.mark.multi_gpu(2)
def test_needs_two():
    pass

def test_cpu():
    pass
"""


def fake_gpus(pytester: pytest.Pytester, gpus: list) -> None:
    pytester.makeconftest(FAKE_GPU_CONFTEST.format(gpus=gpus))


def test_large_gpu_skips_with_the_memory_found(pytester):
    fake_gpus(pytester, [("NVIDIA FakeGPU", 16.0)])
    pytester.makepyfile(MARKED_TESTS)
    result = pytester.runpytest("-rs", "-p", "no:randomly")
    result.assert_outcomes(passed=2, skipped=2)
    result.stdout.fnmatch_lines([
        "*large_gpu(min_gb=24): needs 24 GiB, found 16.0 GiB on NVIDIA FakeGPU*",
        "*multi_gpu(2): needs 2 CUDA devices, found 1*",
    ])


def test_large_gpu_without_cuda(pytester):
    fake_gpus(pytester, [])
    pytester.makepyfile(MARKED_TESTS)
    result = pytester.runpytest("-rs", "-m", "large_gpu")
    result.assert_outcomes(skipped=2, deselected=2)
    result.stdout.fnmatch_lines(["*large_gpu(min_gb=24): no CUDA device*", "*large_gpu(min_gb=8): no CUDA device*"])


def test_big_enough_gpus_run(pytester):
    fake_gpus(pytester, [("NVIDIA H200", 139.8), ("NVIDIA H200", 139.8)])
    pytester.makepyfile(MARKED_TESTS)
    pytester.runpytest().assert_outcomes(passed=4)


GATED_TEST = """
import sys
sys.path.insert(0, {tests_dir!r})
from _synthetic_results import make_result

def test_case(specbench_gate):
    specbench_gate(make_result(seed={seed}, accept_scale={scale}))
"""


def gated(pytester, tests_dir, *, seed=0, scale=1.0):
    pytester.makepyfile(test_gated=GATED_TEST.format(tests_dir=str(tests_dir), seed=seed, scale=scale))


@pytest.fixture()
def tests_dir(request):
    return request.path.parent


def test_update_then_gate_pass_regression_and_improvement(pytester, tests_dir):
    baselines = pytester.path / "baselines"
    args = ["--specbench-baselines", str(baselines), "-p", "no:cacheprovider"]

    gated(pytester, tests_dir)
    result = pytester.runpytest(*args, "--specbench-update-baselines")
    result.assert_outcomes(passed=1)
    stored = json.loads((baselines / "medusa.json").read_text())
    assert "medusa-chain-k3" in stored["cases"]

    result = pytester.runpytest(*args)  # the same result: pass
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*specbench: cases vs baselines*", "medusa/medusa-chain-k3*pass*"])

    gated(pytester, tests_dir, seed=1, scale=0.6)  # a real 40% drop in acceptance
    result = pytester.runpytest(*args)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*acceptance_rate*regressed*baseline*tolerance*"])

    gated(pytester, tests_dir, seed=2, scale=1.4)  # better than the baseline: never a failure
    result = pytester.runpytest(*args, "-s")
    result.assert_outcomes(passed=1)


def test_results_file_gets_one_line_per_case(pytester, tests_dir):
    baselines = pytester.path / "baselines"
    gated(pytester, tests_dir)
    results = pytester.path / "out" / "results.jsonl"
    pytester.runpytest("--specbench-baselines", str(baselines), "--specbench-update-baselines").assert_outcomes(passed=1)
    pytester.runpytest("--specbench-baselines", str(baselines), "--specbench-results", str(results)).assert_outcomes(passed=1)
    pytester.runpytest("--specbench-baselines", str(baselines), "--specbench-results", str(results)).assert_outcomes(passed=1)
    lines = results.read_text().splitlines()
    assert len(lines) == 2
    record = json.loads(lines[0])
    assert record["case_id"] == "medusa/medusa-chain-k3" and "metrics" in record


def test_junitxml_carries_metrics(pytester, tests_dir):
    baselines = pytester.path / "baselines"
    gated(pytester, tests_dir)
    pytester.runpytest("--specbench-baselines", str(baselines), "--specbench-update-baselines")
    xml = pytester.path / "junit.xml"
    pytester.runpytest("--specbench-baselines", str(baselines), f"--junitxml={xml}").assert_outcomes(passed=1)
    text = xml.read_text()
    assert 'name="specbench.acceptance_rate"' in text and 'name="specbench.gate" value="pass"' in text


def test_history_option_records_results_and_gate_outcomes(pytester, tests_dir):
    from specbench.gating.history import load_history

    baselines = pytester.path / "baselines"
    history = pytester.path / "history"
    gated(pytester, tests_dir)
    pytester.runpytest("--specbench-baselines", str(baselines), "--specbench-update-baselines").assert_outcomes(passed=1)
    pytester.runpytest("--specbench-baselines", str(baselines), "--specbench-history", str(history)).assert_outcomes(passed=1)
    frame = load_history(history)
    assert len(frame) == 1 and frame.iloc[0]["case_id"] == "medusa/medusa-chain-k3"


MANY_CASES = """
import sys
import pytest
sys.path.insert(0, {tests_dir!r})
from _synthetic_results import make_result

@pytest.mark.parametrize("index", range({count}))
def test_case(index, specbench_gate):
    specbench_gate(make_result(seed=index, num_requests=4, name=f"case-{{index}}"))
"""


def test_eight_xdist_workers_lose_no_record(pytester, tests_dir):
    """8 workers append to one results file and one history at once: every record arrives whole."""
    from specbench.gating.history import load_history

    count = 48
    pytester.makepyfile(test_many=MANY_CASES.format(tests_dir=str(tests_dir), count=count))
    results = pytester.path / "results.jsonl"
    history = pytester.path / "history"
    outcome = pytester.runpytest_subprocess(
        "-n", "8", "-p", "no:cacheprovider", "--specbench-baselines", str(pytester.path / "baselines"),
        "--specbench-results", str(results), "--specbench-history", str(history), timeout=300,
    )
    outcome.assert_outcomes(passed=count)
    lines = results.read_text().splitlines()
    assert len(lines) == count
    assert sorted(json.loads(line)["case_id"] for line in lines) == sorted(f"medusa/case-{i}" for i in range(count))
    frame = load_history(history)
    assert len(frame) == count and frame["case_id"].nunique() == count


def test_unavailable_checkpoints_skip_with_the_precise_reason(monkeypatch, tmp_path):
    """The upstream Vicuna case on a machine without the checkpoints: a skip naming the hub id and
    HF_HUB_OFFLINE, never a crash or a silent download."""
    from specbench.cases import find_case
    from specbench.pytest_plugin import skip_unless_available

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    (case,) = find_case("medusa/vicuna-7b-upstream")
    with pytest.raises(pytest.skip.Exception, match=r"medusa/vicuna-7b-upstream: .*lmsys/vicuna-7b-v1\.3.*HF_HUB_OFFLINE"):
        skip_unless_available(case)


def test_unset_synth_dir_skips_with_the_variable_to_set(monkeypatch):
    from specbench.cases import find_case
    from specbench.pytest_plugin import skip_unless_available

    monkeypatch.delenv("SPECBENCH_SYNTH_DIR", raising=False)
    (case,) = find_case("medusa/synth-7b-chain-k3-fp32")
    with pytest.raises(pytest.skip.Exception, match="SPECBENCH_SYNTH_DIR, which is not set.*specbench zoo synth"):
        skip_unless_available(case)
