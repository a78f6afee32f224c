"""Rounds of A/B runs: the same cases from a base tree and a head tree, each run in a fresh process of its own
tree's `specbench run`, interleaved on this machine (docs/ab.md#runs).

A round runs every case once per side; odd rounds run the head first, so drift over the session (clocks, heat,
caches warming) falls on both sides alike. Each process's result records the commit it ran (env.git_commit),
which is checked against the tree, so a stray import of another checkout cannot pass unnoticed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable

from specbench.cpu_threads import THREADS_ENV, decide_here
from specbench.gating.baselines import case_changes
from specbench.gating.worktrees import Tree

# reads a tree's case definitions through that tree's own code, without torch (specbench.cases is light)
_PROBE = ("import json, sys\nfrom specbench.cases import find_case\n"
          "print(json.dumps({spec: [c.to_dict() for c in find_case(spec)] for spec in sys.argv[1:]}))")
# variables naming paths: made absolute, since each side runs with its worktree as the working directory
_PATH_VARIABLE_PREFIX = "SPECBENCH_"


class ABRefused(ValueError):
    """A comparison that cannot be made as asked (bad input: exit status 2)."""


class RunFailed(RuntimeError):
    """A side's process ended without a result: its command, exit status and the end of its output."""


@lru_cache(maxsize=1)
def _ab_threads() -> int:
    return decide_here().threads


def child_environment(overrides: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a side's process: relative SPECBENCH_* paths made absolute, torch's CPU
    threads pinned (OMP_NUM_THREADS, unless set), then ``overrides`` (a side's --*-env settings; PYTHONPATH is
    prepended to the inherited one).

    The threads are decided once, here, for every process of both sides: each `specbench run` would otherwise
    size them from the load it sees when it starts (specbench/cpu_threads.py), which differs between rounds and
    sides, and a base commit older than that policy would not size them at all."""
    env = dict(os.environ)
    env.setdefault(THREADS_ENV, str(_ab_threads()))
    for key, value in env.items():
        if key.startswith(_PATH_VARIABLE_PREFIX) and value and not os.path.isabs(value) and os.path.exists(value):
            env[key] = os.path.abspath(value)
    for key, value in (overrides or {}).items():
        if key == "PYTHONPATH" and env.get(key):
            value = value + os.pathsep + env[key]
        env[key] = value
    return env


def read_cases(tree: Tree, specs: list[str], env: dict[str, str]) -> dict[str, list[dict]]:
    """spec -> the case definitions ``tree``'s code reads for it; ABRefused naming the tree when it has none."""
    done = subprocess.run([sys.executable, "-c", _PROBE, *specs], cwd=tree.path, env=env, capture_output=True,
                          text=True)
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ABRefused(f"{tree.label} ({tree.short}) cannot run {' '.join(specs)}: {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def check_same_cases(base: dict[str, list[dict]], head: dict[str, list[dict]], base_tree: Tree, head_tree: Tree,
                     *, allow_case_change: bool) -> list[str]:
    """The differences between the two trees' definitions of each case, as lines; ABRefused when any differ and
    ``allow_case_change`` is off (a changed case is a different measurement, not a slower one)."""
    lines = []
    for spec in base:
        base_cases = {c["name"]: c for c in base[spec]}
        head_cases = {c["name"]: c for c in head[spec]}
        if set(base_cases) != set(head_cases):
            lines.append(f"{spec}: {base_tree.short} has {sorted(base_cases)}, {head_tree.short} has {sorted(head_cases)}")
            continue
        for name, case in base_cases.items():
            changes = case_changes(case, head_cases[name], labels=(base_tree.short, head_tree.short))
            if changes:
                lines.append(f"{case.get('suite')}/{name}: " + "; ".join(changes))
    if lines and not allow_case_change:
        raise ABRefused("the case definitions differ between the trees, so their speeds are not comparable: "
                        + " | ".join(lines) + " (pass --allow-case-change to compare anyway)")
    return lines


@dataclass
class ProcessRunner:
    """Runs one case on one side in a fresh `python -m specbench.cli run` of that side's tree; returns its result.

    ``run_args``: the run-setting flags both sides get (e.g. ``--num-prompts 2``); ``env``: per side label, the
    environment of its processes; ``log_dir``: each process's output, kept for the failure message; ``warmup``:
    processes run unrecorded before a commit's first recorded run of a case (docs/ab.md#warm-up), reported to
    ``progress``."""

    run_args: list[str] = field(default_factory=list)
    env: dict[str, dict[str, str]] = field(default_factory=dict)
    log_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="specbench-ab-")))
    warmup: int = 1
    progress: Callable[[str], None] | None = None
    warmed: set[tuple[str, str]] = field(default_factory=set, init=False, repr=False)  # (commit, spec) warmed so far

    def __post_init__(self) -> None:
        self.log_dir = Path(self.log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)  # a --runs-dir's logs/ is new on its first invocation

    def __call__(self, tree: Tree, side: str, spec: str, round_index: int) -> list[dict]:
        if (tree.commit, spec) not in self.warmed:  # the same commit on both sides (an unchanged A/B) warms once
            self.warmed.add((tree.commit, spec))
            for n in range(self.warmup):
                started = time.perf_counter()
                results = self._run(tree, side, spec, f"warmup{n}")
                if self.progress:
                    self.progress(_timed_line(f"warm-up {side} ({tree.short}) {spec}", started, results)
                                  + ", not recorded")
        return self._run(tree, side, spec, f"r{round_index}")

    def _run(self, tree: Tree, side: str, spec: str, label: str) -> list[dict]:
        stem = f"{label}-{side}-{spec.replace('/', '_')}"
        output, log = self.log_dir / f"{stem}.json", self.log_dir / f"{stem}.log"
        output.unlink(missing_ok=True)  # a kept directory's earlier, cut-short invocation may have left one
        command = [sys.executable, "-m", "specbench.cli", "run", spec, *self.run_args, "--output", str(output),
                   "--no-gate", "--no-history", "-q"]
        with open(log, "w", encoding="utf-8") as handle:
            done = subprocess.run(command, cwd=tree.path, env=self.env.get(side), stdout=handle,
                                  stderr=subprocess.STDOUT)
        if not output.is_file():
            tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-3:]
            raise RunFailed(f"{side} ({tree.short}) run of {spec} exited {done.returncode} without a result: "
                            + " / ".join(tail) + f" (full log: {log})")
        payload = json.loads(output.read_text(encoding="utf-8"))
        results = payload["results"] if "results" in payload else [payload]  # several cases, or one
        for result in results:
            ran = (result.get("env") or {}).get("git_commit")
            if "error" not in result and ran != tree.commit:
                raise RunFailed(f"the {side} process for {spec} ran specbench from commit {ran}, not {tree.commit} "
                                f"(its worktree {tree.path}): is another checkout first on PYTHONPATH?")
        return results


Runner = Callable[[Tree, str, str, int], list[dict]]


def _figures(results: list[dict]) -> str:
    """A process's headline figures for its progress line, so that a comparison cut short still shows them."""
    parts = []
    for result in results:
        metrics = result.get("metrics") or {}
        shown = [f"{label} {metrics[name] * scale:.4g}" for name, label, scale in
                 (("tokens_per_s", "tok/s", 1), ("step_latency_s", "T(1) ms", 1000), ("speedup", "speedup", 1))
                 if isinstance(metrics.get(name), (int, float))]
        if shown:
            parts.append(", ".join(shown))
    return f" ({'; '.join(parts)})" if parts else ""


def _timed_line(what: str, started: float, results: list[dict]) -> str:
    """``what``, the seconds since ``started`` and the process's headline figures: one progress line."""
    return f"{what}: {time.perf_counter() - started:.1f} s" + _figures(results)


def _run_pair(base: Tree, head: Tree, spec: str, r: int, rounds: int, runner: Runner,
              progress: Callable[[str], None] | None) -> dict[str, list[dict]]:
    """Both sides' results of one case spec in round ``r``, the side going first alternating per round."""
    order = [("base", base), ("head", head)]
    if r % 2:
        order.reverse()
    by_side = {}
    for side, tree in order:
        started = time.perf_counter()
        by_side[side] = runner(tree, side, spec, r)
        if progress:
            progress(_timed_line(f"round {r + 1}/{rounds} {side} ({tree.short}) {spec}", started, by_side[side]))
    return by_side


def run_rounds(base: Tree, head: Tree, specs: list[str], rounds: int, runner: Runner, *,
               progress: Callable[[str], None] | None = None, kept=None) -> dict[str, list[tuple[dict, dict]]]:
    """case id -> [(base result, head result) per round], the sides alternating which goes first per round.
    A case that faults on either side (an error entry) maps to its error entries instead of pairs. ``kept``
    (specbench.gating.ab_kept.KeptRounds): pairs a cut-short invocation finished are reused, new ones kept."""
    pairs: dict[str, list[tuple[dict, dict]]] = {}
    for r in range(rounds):
        for spec in specs:
            by_side = kept.load(r, spec) if kept is not None else None
            if by_side is not None:
                if progress:
                    progress(f"round {r + 1}/{rounds} {spec}: kept from {kept.directory}"
                             + _figures(by_side["base"] + by_side["head"]))
            else:
                by_side = _run_pair(base, head, spec, r, rounds, runner, progress)
                if kept is not None:
                    kept.save(r, spec, by_side)
            base_by_id = {result["case_id"]: result for result in by_side["base"]}
            for head_result in by_side["head"]:
                case_id = head_result["case_id"]
                if case_id in base_by_id:  # the trees' definitions were checked alike: a case on one side only
                    pairs.setdefault(case_id, []).append((base_by_id[case_id], head_result))  # is refused before
    return pairs


@dataclass
class Comparison:
    """What compare_trees found: per case id its rounds' pairs and its report (None for a case that faulted, whose
    error entry is in ``errors``), the differences between the trees' case definitions when allowed."""

    base: Tree
    head: Tree
    rounds: int
    pairs: dict[str, list[tuple[dict, dict]]]
    reports: dict[str, object]
    errors: dict[str, dict]
    case_changes: list[str]

    @property
    def passed(self) -> bool:
        return not self.errors and all(report.passed for report in self.reports.values())

    def recorded(self, case_id: str) -> dict:
        """The case's last head run as the history records it: ``details.ab`` names the base, the head, the rounds."""
        last = self.pairs[case_id][-1][1]
        ab = {"base": self.base.commit, "base_rev": self.base.label, "head": self.head.commit,
              "head_dirty": self.head.dirty, "rounds": self.rounds}
        return {**last, "details": {**(last.get("details") or {}), "ab": ab}}


def compare_trees(base: Tree, head: Tree, specs: list[str], *, rounds: int, runner: Runner, env: dict[str, str],
                  tolerances: dict | None = None, confidence: float | None = None, allow_case_change: bool = False,
                  progress: Callable[[str], None] | None = None, kept=None) -> Comparison:
    """Check both trees define the cases alike, run the rounds (reusing ``kept``'s, run_rounds), and judge each
    case (specbench.gating.ab)."""
    from specbench.gating.ab import AB_CONFIDENCE, MIN_ROUNDS, ab_report

    if rounds < MIN_ROUNDS:
        raise ABRefused(f"--rounds {rounds}: an A/B interval needs at least {MIN_ROUNDS} rounds (pairs of runs)")
    changes = check_same_cases(read_cases(base, specs, env), read_cases(head, specs, env), base, head,
                               allow_case_change=allow_case_change)
    if progress:
        progress(f"A/B: base {base.label} ({base.short}) against head {head.label} ({head.short}), {rounds} rounds of "
                 "fresh processes")
    pairs = run_rounds(base, head, specs, rounds, runner, progress=progress, kept=kept)
    reports, errors = {}, {}
    against = f"{base.label} ({base.short}), A/B over {rounds} rounds"
    for case_id, case_pairs in pairs.items():
        faulted = next((r for pair in case_pairs for r in pair if "error" in r), None)
        if faulted is not None:
            errors[case_id] = faulted
            continue
        reports[case_id] = ab_report(case_id, case_pairs, against=against, tolerances=tolerances,
                                     confidence=confidence or AB_CONFIDENCE)
    return Comparison(base, head, rounds, pairs, reports, errors, changes)
