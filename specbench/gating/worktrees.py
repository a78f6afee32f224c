"""Git worktrees of the trees an A/B comparison or a bisection runs: a commit, or a snapshot of the working tree,
checked out beside the repository and removed afterwards, so the user's checkout is never touched (docs/ab.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

WORKING_TREE = "working tree"
# untracked files here would change what runs, yet a snapshot of the working tree leaves them out
CODE_DIRECTORIES = ("specbench", "suites", "bench")


class GitError(ValueError):
    """A git command refused (bad revision, not a repository): bad input, exit status 2."""


def git(repo: Path | str, *args: str, check: bool = True) -> str:
    """Stripped stdout of ``git -C repo args``; GitError with git's own message when it fails and ``check``."""
    env = {**os.environ, "LC_ALL": "C", "GIT_TERMINAL_PROMPT": "0"}
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=env)
    if check and done.returncode:
        message = (done.stderr or done.stdout).strip().splitlines()
        raise GitError(f"`git {' '.join(args)}` failed in {repo}: {message[-1] if message else 'exit ' + str(done.returncode)}")
    return done.stdout.strip()


def repository_root(start: Path | str) -> Path:
    try:
        return Path(git(start, "rev-parse", "--show-toplevel"))
    except GitError:
        raise GitError(f"{start} is not inside a git repository; compare and bisect check out commits of the "
                       "repository that holds the specbench tree: run them from a clone") from None


def resolve_commit(repo: Path, rev: str) -> str:
    """The full hash of ``rev``; GitError naming it when it is not a commit of ``repo``."""
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except GitError:
        raise GitError(f"{rev!r} is not a commit of {repo}; give a branch, tag or hash (`git log --oneline` lists "
                       "them)") from None


def untracked_code(repo: Path) -> list[str]:
    """Untracked, not ignored files under the code directories: a snapshot of the working tree would drop them."""
    listing = git(repo, "ls-files", "--others", "--exclude-standard", "--", *CODE_DIRECTORIES)
    return [line for line in listing.splitlines() if line]


def working_tree_commit(repo: Path) -> tuple[str, bool]:
    """(a commit holding the working tree's tracked files as they are now, whether they differ from HEAD): HEAD
    when clean, else a dangling commit from ``git stash create`` (the checkout and the stash list are untouched).
    Refused when untracked code files would be left out of it."""
    lost = untracked_code(repo)
    if lost:
        shown = ", ".join(lost[:5]) + (f" and {len(lost) - 5} more" if len(lost) > 5 else "")
        raise GitError(f"the working tree has untracked files that the head's snapshot would lose: {shown}; "
                       "`git add` them (no commit needed), delete them, or compare committed code with --head REV")
    snapshot = git(repo, "stash", "create")
    return (snapshot, True) if snapshot else (git(repo, "rev-parse", "HEAD"), False)


@dataclass
class Tree:
    """A checked-out tree: ``label`` as the user named it, ``commit`` its full hash, ``path`` its directory."""

    label: str
    commit: str
    path: Path
    dirty: bool = False

    @property
    def short(self) -> str:
        return self.commit[:7] + ("+" if self.dirty else "")


class Worktrees:
    """Detached worktrees under one temporary directory, all removed (and pruned) on exit."""

    def __init__(self, repo: Path):
        self.repo = repo
        self.directory = Path(tempfile.mkdtemp(prefix="specbench-worktrees-"))
        self.paths: list[Path] = []

    def add(self, label: str, rev: str) -> Tree:
        """A worktree of ``rev``, or of the working tree's snapshot when ``rev`` is WORKING_TREE."""
        commit, dirty = working_tree_commit(self.repo) if rev == WORKING_TREE else (resolve_commit(self.repo, rev), False)
        path = self.directory / f"{label}-{len(self.paths)}"
        git(self.repo, "worktree", "add", "--detach", "--quiet", str(path), commit)
        self.paths.append(path)
        return Tree(rev, commit, path, dirty)

    def close(self) -> None:
        for path in self.paths:
            git(self.repo, "worktree", "remove", "--force", str(path), check=False)
        shutil.rmtree(self.directory, ignore_errors=True)
        git(self.repo, "worktree", "prune", check=False)

    def __enter__(self) -> "Worktrees":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
