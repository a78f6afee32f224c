"""`specbench --help` and the light commands (help of every subcommand, zoo list, report, baselines show) import
neither torch nor transformers: a cold torch import made each of them take 4.6-5.7 s on a 2-core machine."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers")


@pytest.mark.parametrize("argv", [
    ["--help"], ["run", "--help"], ["sweep", "--help"], ["compare", "--help"], ["bisect", "--help"],
    ["calibrate-tree", "--help"], ["zoo", "--help"], ["zoo", "synth", "--help"], ["zoo", "list"],
    ["baselines", "show"], ["report", "--format", "markdown", "--history", "{tmp}"],
    ["run", "--threads", "0"],  # a usage error exits through the same handlers
])
def test_light_commands_import_neither_torch_nor_transformers(argv, tmp_path):
    argv = [arg.replace("{tmp}", str(tmp_path / "history")) for arg in argv]
    # a fresh interpreter: this one imported torch long ago; SystemExit is how --help ends
    check = ("import sys\nfrom specbench.cli import main\n"
             f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
             f"print('HEAVY', [m for m in {HEAVY!r} if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "HEAVY []" in done.stdout, f"specbench {' '.join(argv)} imported {done.stdout.splitlines()[-1]}"


def test_help_loads_no_numeric_library_either():
    # `specbench --help` is argparse and help texts: numpy and pandas (the stores', the report's) wait for a command
    check = ("import sys\nfrom specbench.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
             "print('LOADED', [m for m in ('numpy', 'pandas', 'tqdm', 'torch') if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "LOADED []" in done.stdout, done.stdout.splitlines()[-1]
