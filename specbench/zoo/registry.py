"""Installing a finished zoo build into the package's ``specbench/zoo/artifacts/<build>/`` atomically;
the names it serves and their lookup are :mod:`specbench.references`."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from specbench.references import ARTIFACTS_DIR, BUILD_COMMAND, BUILD_NAME, REFERENCES
from specbench.zoo.build_record import read_record


def make_readable(root: Path) -> None:
    """Give every file 0644 and directory 0755: temp-file writers create 0600 files, and package data
    must be readable by whoever imports specbench, not only by whoever built it."""
    root.chmod(0o755)
    for path in root.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


def find_build_dir(path: str | os.PathLike) -> Path:
    """A build directory given as itself or as the OUT_DIR holding ``<BUILD_NAME>/``."""
    path = Path(path).expanduser()
    return path / BUILD_NAME if (path / BUILD_NAME).is_dir() else path


def install_build(build_dir: str | os.PathLike, *, artifacts_dir: str | os.PathLike | None = None, force: bool = False) -> Path:
    """Copy a finished build into ``artifacts_dir/<BUILD_NAME>`` (default: the package's). The copy is
    complete before it is renamed into place, so a reader never sees a half-copied build; an earlier
    install is moved aside first (and restored on failure). A build that failed its checks is refused
    unless ``force``."""
    source = find_build_dir(build_dir)
    record = read_record(source)
    if record["name"] != BUILD_NAME:
        raise ValueError(f"{source}: build record name is {record['name']!r}, expected {BUILD_NAME!r}")
    if record["status"] != "complete" or (not record["passed"] and not force):
        failed = [check for check, ok in record["checks"].items() if not ok]
        raise ValueError(
            f"{source}: not installed: status {record['status']!r}, failed checks {failed}. Rebuild, or pass "
            "--force to install it anyway."
        )
    missing = [rel for rel in REFERENCES.values() if not (source / rel).exists()]
    if missing:
        raise FileNotFoundError(f"{source}: the build lacks {missing}; rebuild with `{BUILD_COMMAND}`")
    root = Path(artifacts_dir) if artifacts_dir is not None else ARTIFACTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    destination = root / BUILD_NAME
    staging = Path(tempfile.mkdtemp(prefix=f".{BUILD_NAME}.", suffix=".partial", dir=root))
    retired = None
    try:
        shutil.copytree(source, staging, dirs_exist_ok=True)
        make_readable(staging)
        if destination.exists():
            retired = Path(tempfile.mkdtemp(prefix=f".{BUILD_NAME}.", suffix=".old", dir=root))
            os.replace(destination, retired / BUILD_NAME)
        os.replace(staging, destination)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if retired is not None and (retired / BUILD_NAME).exists() and not destination.exists():
            os.replace(retired / BUILD_NAME, destination)  # put the earlier install back
        raise
    finally:
        if retired is not None:
            shutil.rmtree(retired, ignore_errors=True)
    return destination
