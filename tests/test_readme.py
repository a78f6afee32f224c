"""The README opens with exactly two commands, and CI runs the second one verbatim."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    first_block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert first_block, "README.md must open with a ```bash block"
    return [line for line in first_block.group(1).splitlines() if line.strip()]


def test_readme_opens_with_two_commands():
    commands = readme_commands()
    assert len(commands) == 2, commands
    assert "pip install" in commands[0] and "specbench run" in commands[0]
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command():
    ci_lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert readme_commands()[1] in ci_lines


def test_readme_says_which_torch_the_install_brings_and_how_to_get_the_cpu_build():
    # torch==2.13.0 from PyPI on Linux x86-64 is the CUDA build (several GB), not a CPU build
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    intro = text[:text.index("\n## ")]
    assert "with PyTorch's CPU build" not in intro
    assert "CUDA build" in intro and "several GB" in intro
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in intro
