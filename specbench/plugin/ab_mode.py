"""The pytest plugin's A/B mode, ``--specbench-compare BASE``: each ``specbench_run`` case is judged against BASE
on this machine (fresh processes of both trees, interleaved: specbench.gating.ab_runs) instead of against the
stored baselines. The worktrees are made once per session and removed at its end (docs/ab.md#pytest)."""

from __future__ import annotations

from pathlib import Path

import pytest

TREES_KEY = pytest.StashKey[dict]()
DEFAULT_ROUNDS = 6


def add_options(group) -> None:
    group.addoption("--specbench-compare", metavar="BASE", default=None,
                    help="gate each case by an A/B against commit BASE on this machine (fresh processes of both "
                         "trees, interleaved; the head is the working tree) instead of the stored baselines")
    group.addoption("--specbench-compare-rounds", metavar="R", type=int, default=DEFAULT_ROUNDS,
                    help=f"rounds (pairs of runs) per case in --specbench-compare mode (default {DEFAULT_ROUNDS})")


def check_options(config: pytest.Config) -> None:
    from specbench.gating.ab import MIN_ROUNDS

    if not config.getoption("--specbench-compare"):
        return
    if config.getoption("--specbench-update-baselines"):
        raise pytest.UsageError("--specbench-compare judges cases against a base commit and stores nothing: drop "
                                "--specbench-update-baselines, or --specbench-compare")
    if config.getoption("--specbench-compare-rounds") < MIN_ROUNDS:
        raise pytest.UsageError(f"--specbench-compare-rounds {config.getoption('--specbench-compare-rounds')}: an A/B "
                                f"interval needs at least {MIN_ROUNDS} rounds")


def _session_trees(config: pytest.Config) -> dict:
    """The session's base and head worktrees and environments, made at the first A/B case."""
    if TREES_KEY not in config.stash:
        from specbench.gating.ab_runs import child_environment
        from specbench.gating.worktrees import WORKING_TREE, Worktrees, repository_root

        trees = Worktrees(repository_root(Path.cwd()))
        config.add_cleanup(trees.close)
        base = trees.add("base", config.getoption("--specbench-compare"))
        head = trees.add("head", WORKING_TREE)
        config.stash[TREES_KEY] = {"base": base, "head": head, "env": child_environment()}
    return config.stash[TREES_KEY]


def run_ab(config: pytest.Config, case) -> tuple[dict, object]:
    """(the head's last result, its A/B GateReport) for a stored case; the test fails in one line when the case
    cannot be compared (not stored, a tree lacks it, its definition differs, a run failed or faulted)."""
    from specbench.cases import find_case
    from specbench.gating.ab_runs import ABRefused, ProcessRunner, RunFailed, compare_trees
    from specbench.gating.worktrees import GitError

    try:
        stored = find_case(case.case_id)
    except ValueError:
        stored = []
    if [c.to_dict() for c in stored] != [case.to_dict()]:
        pytest.fail(f"{case.case_id}: --specbench-compare runs stored cases by their id (SUITE/NAME), and this case "
                    "is not one (or differs from its suite file's)", pytrace=False)
    try:
        trees = _session_trees(config)
        comparison = compare_trees(trees["base"], trees["head"], [case.case_id],
                                   rounds=config.getoption("--specbench-compare-rounds"),
                                   runner=ProcessRunner([], {"base": trees["env"], "head": trees["env"]}),
                                   env=trees["env"])
    except (ABRefused, GitError, RunFailed) as err:
        pytest.fail(f"{case.case_id}: {err}", pytrace=False)
    if comparison.errors:
        error = comparison.errors[case.case_id]["error"]
        pytest.fail(f"{case.case_id}: ERROR {error['type']}: {error.get('message', '')}", pytrace=False)
    return comparison.recorded(case.case_id), comparison.reports[case.case_id]
