"""The pytest plugin stays light: loading it, or running tests that need no GPU, imports no torch or transformers."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest_plugins = ["pytester"]

HEAVY = ("torch", "transformers")


@pytest.mark.parametrize("module", ["specbench.pytest_plugin", "specbench.env"])
def test_importing_loads_neither_torch_nor_transformers(module):
    # a fresh interpreter: this one imported torch long ago
    check = (f"import sys, {module}; heavy = [m for m in {HEAVY!r} if m in sys.modules]; "
             "assert not heavy, f'imported {heavy}'")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_a_session_without_gpu_tests_imports_no_torch(pytester):
    """pytest loads the plugin through its entry point in every session; only a test that asks for a GPU (and is
    not deselected) makes it look at the GPUs, through torch."""
    pytester.makepyfile(test_light=f"""
import sys
import pytest

@pytest.mark.large_gpu(min_gb=4)
def test_deselected_gpu_test():
    pass

def test_nothing_heavy_was_imported():
    assert not [m for m in {HEAVY!r} if m in sys.modules]
""")
    result = pytester.runpytest_subprocess("-m", "not large_gpu", "-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(passed=1, deselected=1)


def test_no_module_imports_a_posix_only_locking_module():
    """The plugin loads on Windows: file locking goes through specbench.io.file_lock (filelock), never fcntl."""
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parent.parent / "specbench"
    offenders = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.relative_to(package.parent)}:{node.lineno}" for name in names if name in ("fcntl", "msvcrt")]
    assert not offenders, f"use specbench.io.file_lock instead: {offenders}"
