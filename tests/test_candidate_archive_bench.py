"""bench/candidate_archive.sh: HEAD's tree archived with exactly one switch flipped (the zoo artifacts and bench
results left out, as bench/ab_archives.py unpacks them), and an expression that changes nothing refused."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

from _bench_scripts import BENCH

SWITCH = "specbench/eagle/captured.py"
FLIP = "s/^COMPILE_DRAFT = False$/COMPILE_DRAFT = True/"


def repository(root: Path) -> Path:
    """A small repository whose HEAD holds the switch, a zoo artifact, a bench result and an uncommitted edit."""
    files = {SWITCH: "X = 1\nCOMPILE_DRAFT = False\n", "README.md": "hello\n",
             "specbench/zoo/artifacts/model.bin": "weights\n", "bench/results/r.json": "{}\n"}
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "base"], check=True)
    (root / "README.md").write_text("uncommitted\n", encoding="utf-8")  # not HEAD's: never archived
    return root


def archived(path: Path) -> dict[str, str]:
    with tarfile.open(path) as tar:
        return {m.name.removeprefix("./"): tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}


def test_the_candidate_is_heads_tree_with_one_line_flipped(tmp_path):
    root = repository(tmp_path)
    script = str(BENCH / "candidate_archive.sh")
    base = subprocess.run(["bash", script, "HEAD"], cwd=root, capture_output=True, text=True)
    flipped = subprocess.run(["bash", script, "cdraft", SWITCH, FLIP], cwd=root, capture_output=True, text=True)
    assert base.returncode == flipped.returncode == 0, base.stderr + flipped.stderr
    assert "> COMPILE_DRAFT = True" in flipped.stdout  # the diff is shown
    head, candidate = archived(root / ".ab" / "HEAD.tar.gz"), archived(root / ".ab" / "cdraft.tar.gz")
    assert head == {SWITCH: "X = 1\nCOMPILE_DRAFT = False\n", "README.md": "hello\n"}
    assert candidate == {**head, SWITCH: "X = 1\nCOMPILE_DRAFT = True\n"}


def test_an_expression_that_changes_nothing_is_refused_and_writes_nothing(tmp_path):
    root = repository(tmp_path)
    result = subprocess.run(["bash", str(BENCH / "candidate_archive.sh"), "nothing", SWITCH, "s/^NO SUCH LINE$/x/"],
                            cwd=root, capture_output=True, text=True)
    assert result.returncode == 2
    assert "changes nothing in specbench/eagle/captured.py" in result.stderr
    assert not (root / ".ab" / "nothing.tar.gz").exists()
