"""Short names of specbench's own reference models (the "zoo") and where they live: the package's
``specbench/zoo/artifacts/<build>/`` (or ``$SPECBENCH_ZOO_DIR/<build>/``), filled by ``specbench zoo build``
and installed atomically from a finished build."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from specbench.zoo.build_record import read_record

ARTIFACTS_DIR = Path(__file__).resolve().parent / "artifacts"
# a directory holding finished builds (e.g. a build's OUT_DIR), used instead of the package's own
ZOO_DIR_ENV = "SPECBENCH_ZOO_DIR"
BUILD_NAME = "gsm8k-tiny"
BUILD_COMMAND = "specbench zoo build OUT_DIR --install"

# short name -> path inside the build directory
REFERENCES: dict[str, str] = {
    "specbench-ref/gsm8k-tiny": "target",
    "specbench-ref/gsm8k-tiny-medusa": "medusa",
    "specbench-ref/gsm8k-tiny-draft": "draft",
    "gsm8k-tiny-63": "trees/gsm8k-tiny-63.json",
    "gsm8k-tiny-15": "trees/gsm8k-tiny-15.json",
}


class ZooArtifactMissing(FileNotFoundError):
    """A zoo name whose files are not there: the zoo was never built or installed here."""


def zoo_root() -> Path:
    """Where builds are looked up: ``$SPECBENCH_ZOO_DIR`` when set, else the package's artifacts."""
    override = os.environ.get(ZOO_DIR_ENV)
    return Path(override).expanduser() if override else ARTIFACTS_DIR


def zoo_names() -> list[str]:
    return list(REFERENCES)


def resolve_zoo_ref(name: str) -> Path | None:
    """The path a zoo name stands for; None when ``name`` is not a zoo name (so callers go on to
    local directories and hub ids). Raises ZooArtifactMissing when it is one but is not installed."""
    if name not in REFERENCES:
        return None
    root = zoo_root()
    path = root / BUILD_NAME / REFERENCES[name]
    if not path.exists():
        where = f"${ZOO_DIR_ENV}={root}" if os.environ.get(ZOO_DIR_ENV) else "the package's zoo directory"
        raise ZooArtifactMissing(
            f"{name!r} is a specbench reference model, but {path} does not exist ({where}): the zoo has not "
            f"been built and installed here. Create it with `{BUILD_COMMAND}` (on a GPU: "
            f"`bash bench/zoo_build.sh OUT_DIR`, then `specbench zoo install OUT_DIR`), or set {ZOO_DIR_ENV} "
            "to the OUT_DIR of a finished build."
        )
    return path


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
