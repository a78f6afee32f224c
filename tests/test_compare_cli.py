"""`specbench compare`: refusals (exit 2, one line naming what is wrong), verdicts from scripted timings, the JSON
and history records of an A/B run, and a scratch repository left as it was (docs/ab.md)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from specbench.cli import main
from specbench.gating import ab_runs
from specbench.gating.history import read_records
from tests._scratch_repo import commit_all, copy_project, git, repository_state
from tests._synthetic_results import make_result
from tests.test_ab import PROCESS_JITTER, ROUND_DRIFT

CASE = "demo/tiny-ngram-k3"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A copy of the project with two more commits: c2 adds a case, c3 changes tiny-ngram-k3's max_new_tokens."""
    repo = tmp_path_factory.mktemp("scratch") / "repo"
    repo.mkdir()
    c1 = copy_project(repo)
    suite = repo / "specbench" / "cases" / "demo.toml"
    text = suite.read_text(encoding="utf-8")
    suite.write_text(text + '\n[[case]]\nname = "tiny-ngram-k2"\ntarget = "specbench-tiny/random-llama"\n'
                     'proposer = { name = "ngram", num_speculative_tokens = 2 }\n'
                     'prompts = { name = "synthetic", num_prompts = 2 }\nmax_new_tokens = 8\ngate_quality = false\n',
                     encoding="utf-8")
    c2 = commit_all(repo, "a new case")
    suite.write_text(suite.read_text(encoding="utf-8").replace("max_new_tokens = 64", "max_new_tokens = 48", 1),
                     encoding="utf-8")
    c3 = commit_all(repo, "tiny-ngram-k3 decodes fewer tokens")
    git(repo, "checkout", "--quiet", c1)
    return repo, [c1, c2, c3]


@pytest.fixture
def in_scratch(scratch, monkeypatch):
    repo, commits = scratch
    monkeypatch.chdir(repo)
    before = repository_state(repo)
    yield repo, commits
    assert repository_state(repo) == before  # no worktree, stash, branch or file left behind


def scripted_runner(head_speed: float, calls: list, options: list | None = None):
    """A ProcessRunner stand-in: results of scripted speed, the head at ``head_speed`` times the base; the keyword
    options each runner is made with go to ``options``."""

    class Runner:
        def __init__(self, run_args, env, log_dir=None, **kwargs):
            self.run_args, self.env = run_args, env
            if options is not None:
                options.append(kwargs)

        def __call__(self, tree, side, spec, round_index):
            calls.append((side, tree.commit, spec, round_index, self.run_args))
            scale = ROUND_DRIFT[round_index % 5] * (head_speed * PROCESS_JITTER[(round_index + 2) % 5]
                                                    if side == "head" else PROCESS_JITTER[round_index % 5])
            result = make_result(0, num_requests=10, speed_scale=scale, name="tiny-ngram-k3", suite="demo")
            result["env"]["git_commit"] = tree.commit
            return [result]

    return Runner


def refused(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_a_base_that_is_not_a_commit_is_refused(in_scratch, capsys):
    err = refused(capsys, ["compare", "no-such-branch", CASE])
    assert "'no-such-branch' is not a commit" in err


def test_outside_a_repository_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert "not inside a git repository" in refused(capsys, ["compare", "HEAD", CASE])


def test_fewer_than_two_rounds_are_refused(in_scratch, capsys):
    repo, (c1, _, _) = in_scratch
    assert "--rounds 1" in refused(capsys, ["compare", c1, CASE, "--head", c1, "--rounds", "1", "--no-history"])
    assert "--warmup -1: expected 0 or more" in refused(capsys, ["compare", c1, CASE, "--warmup", "-1"])


def test_the_warmup_option_reaches_the_runner(in_scratch, monkeypatch):
    _, (c1, _, _) = in_scratch
    options = []
    monkeypatch.setattr(ab_runs, "ProcessRunner", scripted_runner(1.0, [], options))
    assert main(["compare", c1, CASE, "--head", c1, "--rounds", "2", "--warmup", "2", "--no-history", "-q"]) == 0
    assert [o["warmup"] for o in options] == [2] and options[0]["progress"] is None  # -q: no progress lines


def test_each_commit_runs_unrecorded_warmup_processes_before_its_first_recorded_run(tmp_path, monkeypatch):
    """The first process on a fresh machine fills the compile caches (docs/ab.md#warm-up): ProcessRunner runs
    ``warmup`` processes per (commit, case) first, once per invocation, logged apart and reported, not returned."""
    from specbench.gating.worktrees import Tree

    base, head = Tree("b", "1" * 40, tmp_path / "b"), Tree("h", "2" * 40, tmp_path / "h")
    commits = {str(base.path): base.commit, str(head.path): head.commit}
    ran = []

    def fake_run(command, cwd, env, stdout, stderr):
        output = Path(command[command.index("--output") + 1])
        ran.append(output.stem)
        result = make_result(len(ran), num_requests=2, name="tiny-ngram-k3", suite="demo")
        result["env"]["git_commit"] = commits[str(cwd)]
        output.write_text(json.dumps(result), encoding="utf-8")
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(ab_runs.subprocess, "run", fake_run)
    lines = []
    runner = ab_runs.ProcessRunner([], {}, tmp_path / "logs", warmup=1, progress=lines.append)
    same = Tree("h", base.commit, tmp_path / "b")  # an unchanged A/B: both sides one commit, warmed once
    returned = [runner(base, "base", CASE, 0), runner(same, "head", CASE, 0), runner(head, "head", CASE, 1)]
    stem = "demo_tiny-ngram-k3"
    assert ran == [f"warmup0-base-{stem}", f"r0-base-{stem}", f"r0-head-{stem}", f"warmup0-head-{stem}",
                   f"r1-head-{stem}"]
    assert [r[0]["case_id"] for r in returned] == ["demo/tiny-ngram-k3"] * 3
    assert len(lines) == 2 and all(line.startswith("warm-up ") and line.endswith("not recorded") for line in lines)
    ran.clear()
    cold = ab_runs.ProcessRunner([], {}, tmp_path / "logs", warmup=0)
    cold(base, "base", CASE, 0)
    assert ran == [f"r0-base-{stem}"]


def test_untracked_code_the_snapshot_would_lose_is_refused(in_scratch, capsys):
    repo, _ = in_scratch
    stray = repo / "specbench" / "stray_module.py"
    stray.write_text("X = 1\n", encoding="utf-8")
    try:
        err = refused(capsys, ["compare", "HEAD", CASE])
    finally:
        stray.unlink()
    assert "untracked files that the head's snapshot would lose: specbench/stray_module.py" in err


def test_a_base_without_the_case_is_refused(in_scratch, capsys):
    _, (c1, c2, _) = in_scratch
    err = refused(capsys, ["compare", c1, "demo/tiny-ngram-k2", "--head", c2, "--no-history"])
    assert f"({c1[:7]}) cannot run demo/tiny-ngram-k2" in err and "has no case 'tiny-ngram-k2'" in err


def test_a_case_whose_definition_differs_is_refused_unless_allowed(in_scratch, capsys, monkeypatch):
    _, (_, c2, c3) = in_scratch
    err = refused(capsys, ["compare", c2, CASE, "--head", c3, "--no-history"])
    assert "max_new_tokens" in err and "64" in err and "48" in err and "--allow-case-change" in err
    calls = []
    monkeypatch.setattr(ab_runs, "ProcessRunner", scripted_runner(1.0, calls))
    assert main(["compare", c2, CASE, "--head", c3, "--allow-case-change", "--rounds", "2", "--no-history", "-q"]) == 0
    assert "case changed (--allow-case-change): demo/tiny-ngram-k3: max_new_tokens" in capsys.readouterr().out


@pytest.mark.parametrize("bad", ["--tolerance=2", "--tolerance=speed=0.1", "--head-env=NOEQUALS"])
def test_bad_flags_are_refused_by_name(in_scratch, capsys, bad):
    err = refused(capsys, ["compare", "HEAD", CASE, bad, "--head", "HEAD", "--no-history"])
    assert bad.split("=")[0] in err


def test_scripted_slowdown_fails_with_a_row_json_and_history(in_scratch, capsys, monkeypatch, tmp_path):
    repo, (c1, c2, _) = in_scratch
    calls = []
    monkeypatch.setattr(ab_runs, "ProcessRunner", scripted_runner(0.9, calls))
    output, history = tmp_path / "ab.json", tmp_path / "history"
    code = main(["compare", c1, CASE, "--head", c2, "--rounds", "4", "--max-new-tokens", "8", "--output", str(output),
                 "--history", str(history), "-q"])
    out = capsys.readouterr().out
    assert code == 1
    # the rounds alternate which side runs first, each case once per side per round
    assert [(side, r) for side, _, _, r, _ in calls] == [("base", 0), ("head", 0), ("head", 1), ("base", 1),
                                                         ("base", 2), ("head", 2), ("head", 3), ("base", 3)]
    assert all(args == ["--max-new-tokens", "8"] for *_, args in calls)  # run settings reach both sides
    assert {commit for side, commit, *_ in calls if side == "base"} == {c1}
    row = next(line for line in out.splitlines() if line.startswith(CASE))
    # the jitter left after pairing is +-0.5% a process: the paired change is -10% within a point
    assert "REGRESSION" in row and re.search(r"tokens_per_s .* -(9\.[5-9]|10\.[0-5])%", row), row
    data = json.loads(output.read_text(encoding="utf-8"))
    assert data["base"]["commit"] == c1 and data["head"]["commit"] == c2 and data["passed"] is False
    (case,) = data["cases"]
    assert len(case["rounds"]) == 4 and case["report"]["passed"] is False
    tokens = next(c for c in case["report"]["checks"] if c["name"] == "tokens_per_s")
    assert tokens["status"] == "regression" and tokens["measured"] / tokens["baseline"] == pytest.approx(0.9, abs=0.01)
    (record, _), = read_records(history)
    assert record["details"]["ab"] == {"base": c1, "base_rev": c1, "head": c2, "head_dirty": False, "rounds": 4}
    assert record["gate"]["passed"] is False and any("tokens_per_s" in f for f in record["gate"]["failures"])


def test_an_unchanged_head_passes_against_the_working_tree(in_scratch, capsys, monkeypatch):
    repo, (c1, _, _) = in_scratch
    calls = []
    monkeypatch.setattr(ab_runs, "ProcessRunner", scripted_runner(1.0, calls))
    assert main(["compare", "HEAD", CASE, "--rounds", "3", "--no-history"]) == 0
    # each process's progress line carries its figures, so a comparison cut short still shows what it measured
    captured = capsys.readouterr()
    assert re.search(r"round 1/3 base \(\w{7}\) demo/tiny-ngram-k3: [\d.]+ s \(tok/s [\d.]+, T\(1\) ms [\d.]+",
                     captured.err)
    assert {commit for _, commit, *_ in calls} == {c1}  # a clean working tree is its HEAD
    assert "pass" in next(line for line in captured.out.splitlines() if line.startswith(CASE))


def test_uncommitted_changes_are_the_head(in_scratch, capsys, monkeypatch):
    repo, (c1, _, _) = in_scratch
    readme = repo / "README.md"
    original = readme.read_text(encoding="utf-8")
    readme.write_text(original + "\nan uncommitted line\n", encoding="utf-8")
    calls = []
    monkeypatch.setattr(ab_runs, "ProcessRunner", scripted_runner(1.0, calls))
    try:
        assert main(["compare", "HEAD", CASE, "--rounds", "2", "--no-history", "-q"]) == 0
    finally:
        readme.write_text(original, encoding="utf-8")
    head_commits = {commit for side, commit, *_ in calls if side == "head"}
    assert len(head_commits) == 1 and head_commits != {c1}
    (snapshot,) = head_commits
    assert "an uncommitted line" in git(repo, "show", f"{snapshot}:README.md")


def test_a_process_running_another_checkout_is_caught(in_scratch, tmp_path):
    """ProcessRunner checks the commit each result records against its tree's."""
    from specbench.gating.worktrees import Tree

    repo, (c1, _, _) = in_scratch
    runner = ab_runs.ProcessRunner([], {}, tmp_path)
    fake_tree = Tree("x", "0" * 40, repo)  # the scratch checkout is at c1, not at this commit
    with pytest.raises(ab_runs.RunFailed, match="ran specbench from commit"):
        runner(fake_tree, "head", CASE, 0)


def test_a_comparison_cut_short_continues_from_its_runs_dir(in_scratch, capsys, monkeypatch, tmp_path):
    """--runs-dir keeps finished pairs: a second invocation runs only the rounds missing, a larger --rounds adds
    rounds, a pair with one side missing runs again whole, and another comparison's directory is refused."""
    _, (c1, c2, _) = in_scratch
    runs = tmp_path / "runs"
    calls = []
    monkeypatch.setattr(ab_runs, "ProcessRunner", scripted_runner(0.9, calls))
    argv = ["compare", c1, CASE, "--head", c2, "--runs-dir", str(runs), "--no-history", "-q"]
    assert main([*argv, "--rounds", "2"]) == 1
    assert [(side, r) for side, _, _, r, _ in calls] == [("base", 0), ("head", 0), ("head", 1), ("base", 1)]
    (runs / "round-1-demo_tiny-ngram-k3.json").unlink()  # as if cut short during round 2
    calls.clear()
    output = tmp_path / "ab.json"
    assert main([*argv, "--rounds", "4", "--output", str(output)]) == 1
    # round 1 runs again whole, rounds 2 and 3 are new, round 0 is kept; the order still alternates by round
    assert [(side, r) for side, _, _, r, _ in calls] == [("head", 1), ("base", 1), ("base", 2), ("head", 2),
                                                         ("head", 3), ("base", 3)]
    (case,) = json.loads(output.read_text(encoding="utf-8"))["cases"]
    assert [r["round"] for r in case["rounds"]] == [0, 1, 2, 3]
    tokens = next(c for c in case["report"]["checks"] if c["name"] == "tokens_per_s")
    assert tokens["status"] == "regression" and tokens["measured"] / tokens["baseline"] == pytest.approx(0.9, abs=0.01)
    calls.clear()
    err = refused(capsys, [*argv, "--rounds", "4", "--head-env", "SPECBENCH_INJECT_VERIFY_SLOWDOWN=0.05"])
    assert f"--runs-dir {runs} holds the rounds of another comparison" in err and "head_env" in err
    err = refused(capsys, ["compare", c1, CASE, "--head", c1, "--runs-dir", str(runs), "--no-history", "-q"])
    assert "head_tree" in err  # c1 and c2 hold different files
    assert calls == []
