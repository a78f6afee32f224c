"""A scratch git repository holding a copy of this project, with a scripted history on top, for the compare and
bisect tests: they check out its commits in worktrees and must leave it as they found it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
# appended to specbench/engine/hf_target.py by the scripted regression: every verify takes 30% longer
SLOW_VERIFY = '''

# scripted regression (tests/test_bisect.py): every verify takes 30% longer, spinning as real work would
_verify_before_regression = HFTarget.verify


def _slower_verify(self, *args, **kwargs):
    import time

    started = time.perf_counter()
    out = _verify_before_regression(self, *args, **kwargs)
    until = time.perf_counter() + 0.3 * (time.perf_counter() - started)
    while time.perf_counter() < until:
        pass
    return out


HFTarget.verify = _slower_verify
'''
SLOW_MARKER = "scripted regression (tests/test_bisect.py)"


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True,
                          env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
                               "GIT_COMMITTER_EMAIL": "t@example.com", "PATH": "/usr/bin:/bin:/usr/local/bin",
                               "HOME": str(repo.parent)})
    return done.stdout.strip()


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "--quiet", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def copy_project(destination: Path) -> str:
    """Copy the project's files (tracked, and untracked but not ignored) into a new repository; the first commit."""
    listing = subprocess.run(["git", "-C", str(PROJECT), "ls-files", "--cached", "--others", "--exclude-standard"],
                             capture_output=True, text=True, check=True).stdout.splitlines()
    for name in listing:
        source = PROJECT / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    git(destination, "init", "--quiet", "-b", "main")
    return commit_all(destination, "the project as it is")


def scripted_history(destination: Path, num_commits: int = 8, slow_at: int = 5) -> list[str]:
    """``num_commits`` commits: the project, then small doc edits; commit ``slow_at`` (1-based) also slows
    HFTarget.verify by 30% (SLOW_VERIFY). Returns the hashes, oldest first."""
    commits = [copy_project(destination)]
    notes = destination / "docs" / "history_notes.md"
    for n in range(2, num_commits + 1):
        with open(notes, "a", encoding="utf-8") as handle:
            handle.write(f"commit {n}\n")
        if n == slow_at:
            with open(destination / "specbench" / "engine" / "hf_target.py", "a", encoding="utf-8") as handle:
                handle.write(SLOW_VERIFY)
        commits.append(commit_all(destination, f"commit {n}" + (": slower verify" if n == slow_at else "")))
    return commits


def repository_state(repo: Path) -> dict:
    """What a compare or bisect must leave as it was: HEAD, branch, status, worktrees, stashes, bisect state."""
    return {"head": git(repo, "rev-parse", "HEAD"), "branch": git(repo, "branch", "--show-current"),
            "status": git(repo, "status", "--porcelain"), "worktrees": git(repo, "worktree", "list", "--porcelain"),
            "stash": git(repo, "stash", "list"), "bisecting": (repo / ".git" / "BISECT_LOG").exists(),
            "refs": git(repo, "for-each-ref", "--format=%(refname)")}
