"""Run a command inside another commit's tree, carried as a `git archive` tarball: for a device machine, whose copy
of the repository is this working tree, to run a branch that is not checked out here (its GPU tier, say). The
archive is unpacked in a fresh temporary directory with this tree's reference models added, as bench/ab_archives.py
unpacks its commits (check `git diff --stat HEAD BRANCH -- specbench/zoo/artifacts` is empty), and COMMAND runs
there with that tree first on PYTHONPATH. Give COMMAND absolute output paths ($OUT is one).

    git archive --format=tar BRANCH -- . ':!specbench/zoo/artifacts' ':!bench/results' | gzip > .ab/BRANCH.tar.gz
    python bench/in_archive.py .ab/BRANCH.tar.gz bash bench/tier_machine.sh $OUT a

SPECBENCH_DATA_DIR defaults to this tree's .ab/data (what a device call carries). Exit status: COMMAND's, 2 when
the archive or the command is missing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_archives import ROOT, unpack_tree  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python bench/in_archive.py ARCHIVE COMMAND [ARG...]", file=sys.stderr)
        return 2
    archive, command = Path(argv[0]), argv[1:]
    if not command:
        print(f"in_archive.py: no COMMAND to run in {archive}", file=sys.stderr)
        return 2
    if not archive.is_file():
        print(f"in_archive.py: no archive at {archive}; make it with git archive (see the header)", file=sys.stderr)
        return 2
    tree = Path(tempfile.mkdtemp()) / "tree"
    try:
        unpack_tree(archive, tree)
    except (tarfile.TarError, OSError) as error:
        print(f"in_archive.py: cannot unpack {archive}: {error}", file=sys.stderr)
        return 2
    env = {**os.environ, "SPECBENCH_DATA_DIR": os.environ.get("SPECBENCH_DATA_DIR", str(ROOT / ".ab" / "data")),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))}
    print(f"in_archive.py: {archive} unpacked in {tree}", flush=True)
    return subprocess.run(command, cwd=tree, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
