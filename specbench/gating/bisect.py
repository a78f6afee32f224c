"""Bisection of a speed regression: `git bisect` in a worktree of its own, each step judged by an A/B comparison
of the candidate against GOOD on this machine (docs/ab.md#bisect). The user's checkout is never touched: the
bisection's state lives in its worktree (git keeps refs/bisect per worktree), removed at the end."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from specbench.gating.ab_runs import ABRefused, Comparison, Runner, compare_trees
from specbench.gating.worktrees import GitError, Tree, Worktrees, git, resolve_commit

_FIRST_BAD = re.compile(r"^([0-9a-f]{40}) is the first bad commit", re.MULTILINE)


@dataclass
class Step:
    """One judged commit: its hash and subject, the metric's check (None when the commit was skipped), verdict."""

    commit: str
    subject: str
    verdict: str  # "bad", "good" or "skip"
    check: object = None
    reason: str = ""

    def line(self) -> str:
        figures = ""
        if self.check is not None and self.check.ci is not None:
            from specbench.gating.ab import check_change

            change = check_change(self.check) * 100
            figures = f" {self.check.name} {self.check.baseline:.4g} -> {self.check.measured:.4g} ({change:+.1f}%)"
        why = f": {self.reason}" if self.reason and self.verdict == "skip" else ""
        return f"{self.commit[:10]} {self.verdict:<4}{figures}  {self.subject}{why}"


@dataclass
class Bisection:
    good: str
    bad: str
    metric: str
    steps: list[Step] = field(default_factory=list)
    first_bad: str | None = None
    message: str = ""

    @property
    def culprit(self) -> Step | None:
        return next((s for s in self.steps if s.commit == self.first_bad), None)


def _subject(repo, commit: str) -> str:
    return git(repo, "log", "-1", "--format=%s", commit)


def _judge(comparison: Comparison, metric: str) -> tuple[str, object, str]:
    """("bad" | "good", the metric's check, why) from an A/B comparison of one case."""
    if comparison.errors:
        case_id, error = next(iter(comparison.errors.items()))
        return "skip", None, f"{case_id} faulted: {error['error']['type']}"
    (report,) = comparison.reports.values()
    check = next((c for c in report.checks if c.name == metric), None)
    if check is None or check.baseline is None:
        raise ABRefused(f"--metric {metric}: the case does not measure it on both sides; metrics it measures: "
                        + ", ".join(c.name for c in report.checks if c.baseline is not None))
    return ("bad" if check.status == "regression" else "good"), check, check.reason


def bisect(repo, good_rev: str, bad_rev: str, spec: str, *, metric: str, rounds: int, runner: Runner,
           env: dict[str, str], tolerances: dict | None = None, confidence: float | None = None,
           allow_case_change: bool = False, progress: Callable[[str], None] | None = None) -> Bisection:
    """Find the first commit between ``good_rev`` and ``bad_rev`` whose A/B against GOOD regresses ``metric``.

    BAD is judged first: when it does not regress against GOOD there is nothing to find (``first_bad`` None).
    A commit the case cannot run on, or whose case definition differs (without ``allow_case_change``), is
    skipped, as `git bisect skip` does."""
    good, bad = resolve_commit(repo, good_rev), resolve_commit(repo, bad_rev)
    if good == bad:
        raise ABRefused(f"GOOD {good_rev} and BAD {bad_rev} are the same commit ({good[:7]}): nothing to bisect")
    if not _is_ancestor(repo, good, bad):
        raise ABRefused(f"GOOD {good_rev} ({good[:7]}) is not an ancestor of BAD {bad_rev} ({bad[:7]}); bisect "
                        "needs GOOD earlier in BAD's history")
    outcome = Bisection(good, bad, metric)
    say = progress or (lambda line: None)

    def judge(candidate: Tree) -> Step:
        subject = _subject(repo, candidate.commit)
        try:
            comparison = compare_trees(good_tree, candidate, [spec], rounds=rounds, runner=runner, env=env,
                                       tolerances=tolerances, confidence=confidence,
                                       allow_case_change=allow_case_change, progress=progress)
        except ABRefused as err:
            if candidate.commit == bad:
                raise
            return Step(candidate.commit, subject, "skip", reason=str(err))
        verdict, check, why = _judge(comparison, metric)
        return Step(candidate.commit, subject, verdict, check, why)

    with Worktrees(repo) as trees:
        good_tree = trees.add("good", good)
        probe = trees.add("bisect", bad)
        first = judge(probe)
        outcome.steps.append(first)
        say("bisect: " + first.line())
        if first.verdict != "bad":
            outcome.message = (f"BAD {bad_rev} ({bad[:7]}) is not slower than GOOD {good_rev} ({good[:7]}) on "
                               f"{metric}: {first.reason}; nothing to bisect")
            return outcome
        text = git(probe.path, "bisect", "start", bad, good)
        try:
            while not _FIRST_BAD.search(text):
                if "only 'skip'ped commits left" in text:
                    outcome.message = "only skipped commits are left: " + text.splitlines()[-1]
                    return outcome
                commit = git(probe.path, "rev-parse", "HEAD")
                step = judge(Tree(commit[:7], commit, probe.path))
                outcome.steps.append(step)
                say("bisect: " + step.line())
                text = git(probe.path, "bisect", step.verdict)
            outcome.first_bad = _FIRST_BAD.search(text).group(1)
        finally:
            git(probe.path, "bisect", "reset", "--quiet", check=False)
    return outcome


def _is_ancestor(repo, older: str, newer: str) -> bool:
    try:
        git(repo, "merge-base", "--is-ancestor", older, newer)
    except GitError:
        return False
    return True
