"""A/B of two commits carried as `git archive` tarballs, for a machine whose copy of the repository has no
usable history (the device machine's): each archive becomes one commit of a scratch repository, then
`specbench compare FIRST CASE... --head SECOND` runs there (docs/ab.md).

    git archive --format=tar BASE -- . ':!specbench/zoo/artifacts' ':!bench/results' | gzip > .ab/BASE.tar.gz
    python bench/ab_archives.py OUT .ab/BASE.tar.gz .ab/HEAD.tar.gz medusa/tree-63-cuda-bf16-static --rounds 3

The reference models under specbench/zoo/artifacts are left out of the archives (they are most of the bytes)
and copied from this tree into both commits: check first that they did not change between the commits
(`git diff --stat BASE HEAD -- specbench/zoo/artifacts` prints nothing). Arguments after the cases go to
`specbench compare`. The comparison's JSON and log land in OUT.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = Path("specbench") / "zoo" / "artifacts"


def _inside(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
    """tarfile's "data" filter, except that a link pointing out of the tree is left out instead of stopping the
    unpacking: commits from 7fee727 to 62b5883 track a stray absolute link, `.data`, that nothing reads."""
    try:
        return tarfile.data_filter(member, path)
    except tarfile.FilterError:
        if member.issym() or member.islnk():
            return None
        raise


def unpack_tree(archive: Path, directory: Path) -> None:
    """``archive``'s tree into ``directory`` (data files only, no link out of it), this tree's zoo artifacts added."""
    with tarfile.open(archive) as tar:
        tar.extractall(directory, filter=_inside)
    shutil.copytree(ROOT / ARTIFACTS, directory / ARTIFACTS, dirs_exist_ok=True)


def commit_archives(directory: Path, archives: list[Path]) -> list[str]:
    """A new repository at ``directory`` with one commit per archive (this tree's zoo artifacts added to each)."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    env = {**os.environ, "GIT_AUTHOR_NAME": "ab", "GIT_AUTHOR_EMAIL": "ab@archives", "GIT_COMMITTER_NAME": "ab",
           "GIT_COMMITTER_EMAIL": "ab@archives"}
    git = lambda *args: subprocess.run(["git", "-C", str(directory), *args], check=True, env=env,  # noqa: E731
                                       capture_output=True, text=True).stdout.strip()
    git("init", "--quiet")
    commits = []
    for archive in archives:
        for entry in directory.iterdir():
            if entry.name != ".git":
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        unpack_tree(archive, directory)
        git("add", "-A")
        git("commit", "--quiet", "--allow-empty", "-m", f"from {archive.name}")
        commits.append(git("rev-parse", "HEAD"))
    return commits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("base", type=Path, help="the base commit's archive (.tar or .tar.gz)")
    parser.add_argument("head", type=Path, help="the head commit's archive")
    parser.add_argument("cases", nargs="+", help="cases, then any `specbench compare` options (after --)")
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/specbench-ab-archives"))
    args, compare_options = parser.parse_known_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    base, head = commit_archives(args.scratch / "repo", [args.base, args.head])
    output = args.out / f"ab_{args.base.name.split('.')[0]}_{args.head.name.split('.')[0]}.json"
    # this tree's compare drives the scratch repository's commits
    command = [sys.executable, "-m", "specbench.cli", "compare", base, *args.cases, "--head", head, "--repo",
               str(args.scratch / "repo"), *compare_options, "--output", str(output.resolve()), "--no-history"]
    print(" ".join(command), flush=True)
    return subprocess.run(command, cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
