"""``specbench bisect GOOD BAD CASE``: the first commit that slowed a case down, each step an A/B against GOOD."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specbench.cli.compare_command import check_rounds, run_flags, side_environments, tolerances_from

BISECT_DESCRIPTION = """\
Drive `git bisect` between GOOD and BAD, judging each commit by an A/B comparison against GOOD on this machine
(the rounds and rule of `specbench compare`) on one speed metric of one case. BAD is judged first; a commit that
cannot run the case is skipped. The bisection runs in a worktree of its own: your checkout, its branch and any
bisection of yours are left as they were.

exit status: 0 the first bad commit was found, 1 none was (BAD is not slower, or only skipped commits are
left), 2 bad input
"""


def cmd_bisect(args: argparse.Namespace) -> int:
    from specbench.gating.ab_runs import ProcessRunner
    from specbench.gating.bisect import bisect
    from specbench.gating.gates import SPEED_METRICS
    from specbench.gating.worktrees import repository_root

    if args.metric not in SPEED_METRICS:
        raise ValueError(f"--metric {args.metric!r}: expected a speed metric, one of {', '.join(SPEED_METRICS)}")
    tolerances = tolerances_from(args.tolerance)
    check_rounds(args.rounds, args.warmup)
    repo = repository_root(args.repo or Path.cwd())
    probe_env, envs = side_environments(args)
    progress = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    outcome = bisect(repo, args.good, args.bad, args.case, metric=args.metric, rounds=args.rounds,
                     runner=ProcessRunner(run_flags(args), envs, warmup=args.warmup, progress=progress),
                     env=probe_env, tolerances=tolerances,
                     confidence=args.confidence, allow_case_change=args.allow_case_change, progress=progress)
    print(f"bisect of {args.case} on {args.metric}, GOOD {args.good} ({outcome.good[:7]}), BAD {args.bad} "
          f"({outcome.bad[:7]}):")
    for step in outcome.steps:
        print("  " + step.line())
    if outcome.first_bad is None:
        print(outcome.message)
        return 1
    culprit = outcome.culprit
    print(f"first bad commit: {outcome.first_bad}")
    if culprit is not None and culprit.check is not None:
        print(f"  {culprit.check.message()}")
    return 0
