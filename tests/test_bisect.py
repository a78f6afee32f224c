"""`specbench bisect`: over a scripted 8-commit history whose 5th commit slows the eager target's verify by 30%,
it names that commit and leaves the repository as it was; with scripted timings, and with real runs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from specbench.gating.ab_runs import ABRefused
from specbench.gating.bisect import bisect
from tests._scratch_repo import SLOW_MARKER, repository_state, scripted_history
from tests._synthetic_results import make_result
from tests.test_ab import PROCESS_JITTER

CASE = "demo/tiny-ngram-k3"


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    repo = tmp_path_factory.mktemp("bisect") / "repo"
    repo.mkdir()
    return repo, scripted_history(repo, num_commits=8, slow_at=5)


def timing_runner(calls: list):
    """Scripted timings: a tree whose hf_target.py carries the scripted regression runs 30% slower."""

    def run(tree, side, spec, round_index):
        slow = SLOW_MARKER in (tree.path / "specbench" / "engine" / "hf_target.py").read_text(encoding="utf-8")
        calls.append((tree.commit, side))
        scale = PROCESS_JITTER[(round_index + (side == "head")) % 5] / (1.3 if slow else 1.0)
        result = make_result(0, num_requests=6, speed_scale=scale, name="tiny-ngram-k3", suite="demo")
        result["env"]["git_commit"] = tree.commit
        return [result]

    return run


def test_bisect_finds_the_fifth_commit_with_scripted_timings(history):
    repo, commits = history
    before = repository_state(repo)
    calls = []
    outcome = bisect(repo, commits[0], commits[-1], CASE, metric="step_latency_s", rounds=3,
                     runner=timing_runner(calls), env=dict(os.environ))
    assert outcome.first_bad == commits[4], [step.line() for step in outcome.steps]
    assert outcome.steps[0].commit == commits[-1] and outcome.steps[0].verdict == "bad"  # BAD is judged first
    assert outcome.culprit.check.status == "regression"
    # every step is an A/B against GOOD: GOOD is always the base
    assert {commit for commit, side in calls if side == "base"} == {commits[0]}
    assert len(outcome.steps) <= 1 + 3  # BAD, then log2(7) rounded up
    assert repository_state(repo) == before


def test_bad_that_is_not_slower_finds_nothing(history):
    repo, commits = history
    outcome = bisect(repo, commits[0], commits[3], CASE, metric="step_latency_s", rounds=2,
                     runner=timing_runner([]), env=dict(os.environ))
    assert outcome.first_bad is None and "is not slower than GOOD" in outcome.message


def test_good_must_precede_bad(history):
    repo, commits = history
    with pytest.raises(ABRefused, match="is not an ancestor of BAD"):
        bisect(repo, commits[5], commits[2], CASE, metric="step_latency_s", rounds=2, runner=timing_runner([]),
               env=dict(os.environ))


REAL_ROUNDS = os.environ.get("SPECBENCH_REAL_BISECT_ROUNDS")


@pytest.mark.skipif(not REAL_ROUNDS, reason="a real bisection on the CPU takes 4 A/B comparisons of R rounds of "
                    "two ~10 s processes (about 10 min at R = 8); set SPECBENCH_REAL_BISECT_ROUNDS=R to run it")
def test_real_bisect_on_the_cpu_names_the_fifth_commit(history):
    """The command itself: fresh processes of each commit's own code, T(1) timed for real on this CPU.

    The reference target's T(1) (8-11 ms on a 2-core machine) moves 15-20% between fresh processes of one commit,
    more under a neighbour's load, so a 30% slowdown needs about 8 rounds to be told apart at every step
    (README, "Did my change slow it down?"); the random tiny demo model's T(1) (1.3 ms, mostly Python) moves more."""
    repo, commits = history
    before = repository_state(repo)
    done = subprocess.run(
        [sys.executable, "-m", "specbench.cli", "bisect", commits[0], commits[-1], "medusa/chain-k3", "--metric",
         "step_latency_s",
         "--rounds", REAL_ROUNDS, "--num-prompts", "1", "--max-new-tokens", "8"],
        cwd=repo, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=3600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"first bad commit: {commits[4]}" in done.stdout, done.stdout + done.stderr
    assert repository_state(repo) == before
