"""bench/in_archive.py runs a command inside another commit's tree carried as a tarball (a branch's GPU tier on a
device machine whose copy of the repository is this working tree): that tree's code is imported, this tree's
reference models are added, and a missing archive or command is refused before anything runs."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "in_archive.py"
ARTIFACTS = ROOT / "specbench" / "zoo" / "artifacts"


def _archive(path: Path, files: dict[str, str]) -> Path:
    """A gzipped tar of ``files`` (name -> text), as `git archive ... | gzip` writes a tree."""
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_command_runs_in_the_archives_tree_with_its_code_first(tmp_path):
    archive = _archive(tmp_path / "branch.tar.gz", {"specbench/__init__.py": "BRANCH = 'one-engine'\n"})
    probe = ("import os, specbench; from pathlib import Path; "
             "print(specbench.BRANCH, Path(specbench.__file__).parent.parent == Path.cwd(), "
             "sorted(p.name for p in Path('specbench/zoo/artifacts').iterdir()))")
    done = _run(str(archive), sys.executable, "-c", probe)
    assert done.returncode == 0, done.stderr
    branch, own_tree, artifacts = done.stdout.strip().splitlines()[-1].split(" ", 2)
    assert (branch, own_tree) == ("one-engine", "True")  # the archive's package, imported from its unpacked tree
    assert artifacts == str(sorted(p.name for p in ARTIFACTS.iterdir()))  # this tree's reference models added


def test_the_commands_exit_status_is_the_scripts(tmp_path):
    archive = _archive(tmp_path / "branch.tar.gz", {"README.md": "x\n"})
    assert _run(str(archive), "bash", "-c", "exit 3").returncode == 3


def test_a_missing_archive_or_command_is_refused(tmp_path):
    missing = _run(str(tmp_path / "nope.tar.gz"), "true")
    assert missing.returncode == 2
    assert f"no archive at {tmp_path / 'nope.tar.gz'}; make it with git archive" in missing.stderr
    archive = _archive(tmp_path / "branch.tar.gz", {"README.md": "x\n"})
    bare = _run(str(archive))
    assert bare.returncode == 2 and f"no COMMAND to run in {archive}" in bare.stderr


def test_a_link_out_of_the_tree_is_left_out_and_the_rest_unpacked(tmp_path):
    # commits 7fee727..62b5883 track `.data`, an absolute link; tarfile's "data" filter refuses such a member
    archive = tmp_path / "old.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        link = tarfile.TarInfo(".data")
        link.type, link.linkname = tarfile.SYMTYPE, "/work/main/.data"
        tar.addfile(link)
        data = b"x\n"
        info = tarfile.TarInfo("README.md")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    probe = "from pathlib import Path; print(Path('.data').is_symlink(), Path('README.md').read_text().strip())"
    done = _run(str(archive), sys.executable, "-c", probe)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False x"
