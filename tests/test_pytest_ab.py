"""pytest's A/B mode, --specbench-compare BASE (specbench.plugin.ab_mode), driven through pytester: option refusals, a
scripted slowdown failing the test with the A/B verdict, an unchanged head passing and recorded with details.ab."""

from __future__ import annotations

import pytest

from specbench.gating import ab_runs
from specbench.gating.history import read_records
from tests._scratch_repo import copy_project, repository_state
from tests.test_compare_cli import scripted_runner

pytest_plugins = ["pytester"]

CASE_TEST = """
def test_case(specbench_run):
    specbench_run("demo/tiny-ngram-k3")
"""


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    repo = tmp_path_factory.mktemp("pytest-ab") / "repo"
    repo.mkdir()
    copy_project(repo)
    return repo


@pytest.mark.parametrize("argv,message", [
    (["--specbench-compare", "HEAD", "--specbench-update-baselines", "--specbench-reason", "x"],
     "--specbench-compare judges cases against a base commit and stores nothing"),
    (["--specbench-compare", "HEAD", "--specbench-compare-rounds", "1"], "--specbench-compare-rounds 1"),
])
def test_option_refusals(pytester, argv, message):
    pytester.makepyfile(CASE_TEST)
    result = pytester.runpytest(*argv)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}*"])


def test_outside_a_repository_the_case_fails_in_one_line(pytester):
    pytester.makepyfile(CASE_TEST)
    result = pytester.runpytest("--specbench-compare", "HEAD", "--specbench-no-history")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*demo/tiny-ngram-k3: * is not inside a git repository*"])


@pytest.mark.parametrize("head_speed,outcome", [(0.9, "failed"), (1.0, "passed")])
def test_cases_are_judged_against_the_base(pytester, scratch, monkeypatch, tmp_path, head_speed, outcome):
    test_file = pytester.makepyfile(CASE_TEST)
    calls = []
    monkeypatch.setattr(ab_runs, "ProcessRunner", scripted_runner(head_speed, calls))
    monkeypatch.chdir(scratch)
    before = repository_state(scratch)
    history = tmp_path / "history"
    result = pytester.runpytest(str(test_file), "--specbench-compare", "HEAD", "--specbench-compare-rounds", "4",
                                "--specbench-history", str(history))
    result.assert_outcomes(**{outcome: 1})
    assert len(calls) == 8 and {side for side, *_ in calls} == {"base", "head"}  # 4 rounds, both sides
    if outcome == "failed":
        result.stdout.fnmatch_lines(["*FAILED*against HEAD*A/B over 4 rounds", "*tokens_per_s regressed*"])
    (record, _), = read_records(history)
    assert record["details"]["ab"]["rounds"] == 4 and record["gate"]["passed"] is (outcome == "passed")
    assert repository_state(scratch) == before  # the session's worktrees are gone
