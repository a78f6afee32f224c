"""The pytest plugin, driven through pytester: markers, baseline updates, gates, the results file and history."""

from __future__ import annotations

import json
import re

import pytest

pytest_plugins = ["pytester"]
# storing baselines needs a reason (recorded in their provenance)
UPDATE = ("--specbench-update-baselines", "--specbench-reason", "test")


@pytest.fixture(autouse=True)
def _private_default_history(tmp_path, monkeypatch):
    # every gated run is recorded in the default results history unless told otherwise; keep these runs' records
    # out of the checkout's .specbench/history (tests that look at the default history set their own)
    monkeypatch.setenv("SPECBENCH_HISTORY_DIR", str(tmp_path / "default-history"))

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


GPU_SKIP_LOCATION_TESTS = """
import pytest

@pytest.mark.large_gpu(min_gb=4)
def test_small_gpu():
    pass

@pytest.mark.multi_gpu(2)
def test_two_gpus():
    pass
"""


def _skip_lines(stdout: str) -> dict[str, int]:
    """reason -> reported line number of each ``SKIPPED [1] file:line: reason`` line naming test_skip_at.py."""
    return {reason: int(line) for line, reason in re.findall(r"SKIPPED \[1\] test_skip_at\.py:(\d+): (.+)", stdout)}


def _definition_lines(path, test_name: str) -> set[int]:
    """The 1-based lines a report may give for ``test_name``: its first decorator's or its def's."""
    lines = path.read_text().splitlines()
    def_line = lines.index(f"def {test_name}():") + 1
    return {def_line - 1, def_line}


def test_gpu_skips_are_reported_at_the_tests_own_file_and_line(pytester):
    fake_gpus(pytester, [])
    path = pytester.makepyfile(test_skip_at=GPU_SKIP_LOCATION_TESTS)
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=2)
    assert "pytest_plugin.py" not in result.stdout.str()
    skipped = _skip_lines(result.stdout.str())
    assert set(skipped) == {"large_gpu(min_gb=4): no CUDA device", "multi_gpu(2): needs 2 CUDA devices, found 0"}
    assert skipped["large_gpu(min_gb=4): no CUDA device"] in _definition_lines(path, "test_small_gpu")
    assert skipped["multi_gpu(2): needs 2 CUDA devices, found 0"] in _definition_lines(path, "test_two_gpus")


def test_an_unmeetable_gpu_requirement_skips_at_the_tests_line_on_this_machine(pytester):
    """The real GPU inventory (no fake): no machine has 10**6 GiB, so the test skips wherever this runs."""
    path = pytester.makepyfile(test_skip_at="""
import pytest

@pytest.mark.large_gpu(min_gb=10**6)
def test_huge():
    pass
""")
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    assert "pytest_plugin.py" not in result.stdout.str()
    ((reason, line),) = _skip_lines(result.stdout.str()).items()
    assert reason.startswith("large_gpu(min_gb=1000000): ") and line in _definition_lines(path, "test_huge")


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
    result = pytester.runpytest(*args, *UPDATE)
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
    pytester.runpytest("--specbench-baselines", str(baselines), *UPDATE).assert_outcomes(passed=1)
    pytester.runpytest("--specbench-baselines", str(baselines), "--specbench-results", str(results)).assert_outcomes(passed=1)
    pytester.runpytest("--specbench-baselines", str(baselines), "--specbench-results", str(results)).assert_outcomes(passed=1)
    lines = results.read_text().splitlines()
    assert len(lines) == 2
    record = json.loads(lines[0])
    assert record["case_id"] == "medusa/medusa-chain-k3" and "metrics" in record


def test_junitxml_carries_metrics(pytester, tests_dir):
    baselines = pytester.path / "baselines"
    gated(pytester, tests_dir)
    pytester.runpytest("--specbench-baselines", str(baselines), *UPDATE)
    xml = pytester.path / "junit.xml"
    pytester.runpytest("--specbench-baselines", str(baselines), f"--junitxml={xml}").assert_outcomes(passed=1)
    text = xml.read_text()
    assert 'name="specbench.acceptance_rate"' in text and 'name="specbench.gate" value="pass"' in text


def test_history_option_records_results_and_gate_outcomes(pytester, tests_dir):
    from specbench.gating.history import load_history

    baselines = pytester.path / "baselines"
    history = pytester.path / "history"
    gated(pytester, tests_dir)
    pytester.runpytest("--specbench-baselines", str(baselines), *UPDATE).assert_outcomes(passed=1)
    pytester.runpytest("--specbench-baselines", str(baselines), "--specbench-history", str(history)).assert_outcomes(passed=1)
    frame = load_history(history)
    assert len(frame) == 1 and frame.iloc[0]["case_id"] == "medusa/medusa-chain-k3"


def test_results_go_to_the_default_history_unless_no_history(pytester, tests_dir, monkeypatch):
    """Run, then report: without an option every result lands where `specbench report` reads by default."""
    from specbench.gating.history import load_history

    default = pytester.path / "default-history"
    monkeypatch.setenv("SPECBENCH_HISTORY_DIR", str(default))
    args = ["--specbench-baselines", str(pytester.path / "baselines"), "-p", "no:cacheprovider"]
    gated(pytester, tests_dir)
    pytester.runpytest(*args, *UPDATE).assert_outcomes(passed=1)  # stored, and recorded
    result = pytester.runpytest(*args)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"recorded in the results history {default} *"])
    assert [p.name for p in default.glob("*.jsonl")]  # a history file
    frame = load_history(default)
    assert frame["case_id"].tolist() == ["medusa/medusa-chain-k3"] * 2
    assert frame["gate_passed"].tolist() == [None, True]  # the update run has no gate outcome

    elsewhere = pytester.path / "unused-history"
    monkeypatch.setenv("SPECBENCH_HISTORY_DIR", str(elsewhere))
    result = pytester.runpytest(*args, "--specbench-no-history")
    result.assert_outcomes(passed=1)
    assert not elsewhere.exists() and "recorded in the results history" not in result.stdout.str()
    pytester.runpytest(*args, "--specbench-no-history", *UPDATE).assert_outcomes(passed=1)
    assert not elsewhere.exists() and len(load_history(default)) == 2

    result = pytester.runpytest(*args, "--specbench-no-history", "--specbench-history", str(default))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*give --specbench-history DIR or --specbench-no-history, not both*"])


CORRECTNESS_CASES = """
import sys
sys.path.insert(0, {tests_dir!r})
from _synthetic_results import make_result, with_divergence

def bf16_drift(name, min_match_fraction=None):
    result = with_divergence(make_result(seed=0, dtype="bfloat16", name=name), request_index=0, position=30,
                             match_fraction=0.9)
    if min_match_fraction is not None:
        result["case"]["tolerances"] = {{"min_match_fraction": min_match_fraction}}
    return result

def test_bf16_drift_over_the_default_minimum(specbench_gate):
    specbench_gate(bf16_drift("bf16-drift"))

def test_bf16_drift_under_the_cases_minimum(specbench_gate):
    specbench_gate(bf16_drift("bf16-strict", min_match_fraction=0.95))

def test_fp32_divergence(specbench_gate):
    specbench_gate(with_divergence(make_result(seed=0, name="fp32-diverged"), request_index=2, position=9,
                                   match_fraction=0.97))
"""


def test_updates_and_gates_take_one_correctness_verdict(pytester, tests_dir):
    """Storing and gating judge losslessness alike (gates.check_correctness with the resolved tolerances): a bf16
    run that is not exact but over its minimum match fraction is stored and passes; under the case's own minimum,
    or an fp32 run with any divergence, it is refused and fails, with the same reason."""
    pytester.makepyfile(test_correctness=CORRECTNESS_CASES.format(tests_dir=str(tests_dir)))
    args = ["--specbench-baselines", str(pytester.path / "baselines"), "-p", "no:cacheprovider", "-rf"]
    strict = "match fraction 0.900 is under the minimum 0.950"
    fp32 = ("fp32 speculative output differs from plain decoding: "
            "request 'gsm8k-2' (#2) first diverges at output position 9")

    result = pytester.runpytest(*args, *UPDATE)
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines([f"*refusing to store a baseline for medusa/bf16-strict: {strict}*",
                                 f"*refusing to store a baseline for medusa/fp32-diverged: {fp32}*"])
    result.stdout.fnmatch_lines(["medusa/bf16-drift * updated *", "medusa/bf16-strict * REFUSED *",
                                 "medusa/fp32-diverged * REFUSED *"])
    assert "Traceback" not in result.stdout.str()  # a refusal is a verdict, not a crash
    stored = json.loads((pytester.path / "baselines" / "medusa.json").read_text())
    assert sorted(stored["cases"]) == ["bf16-drift"]

    result = pytester.runpytest(*args)
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines([f"*medusa/bf16-strict: match_fraction failed: {strict}*",
                                 f"*medusa/fp32-diverged: exact_match failed: {fp32}*"])


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


def test_a_launch_bound_case_says_so_beside_its_speedup(pytester, tests_dir):
    """A tiny reference target on CUDA: the summary table marks its speedup and adds the note; a CPU run is not."""
    pytester.makepyfile(test_gated=GATED_TEST.format(tests_dir=str(tests_dir), seed=0, scale=1.0).replace(
        "specbench_gate(make_result(seed=0, accept_scale=1.0))",
        "result = make_result(seed=0)\n    result['case']['device'] = 'cuda'\n    specbench_gate(result)"))
    result = pytester.runpytest("--specbench-baselines", str(pytester.path / "baselines"), *UPDATE)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["medusa/medusa-chain-k3*x launch-bound", "launch-bound: a tiny reference target on CUDA*"])
    gated(pytester, tests_dir)
    result = pytester.runpytest("--specbench-baselines", str(pytester.path / "baselines2"), *UPDATE)
    assert "launch-bound" not in result.stdout.str()
