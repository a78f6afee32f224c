"""The build record of a zoo build (``build_record.json``): what was built from what, with which
libraries, how training went and what it measured, so a rebuild can be compared field by field."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

from specbench.io import strict_json
from specbench.io.atomic_write import write_text_atomic
from specbench.gating.gates import DEFAULT_TOLERANCES

RECORD_FILE = "build_record.json"
RECORD_SCHEMA_VERSION = 1
# every record holds these top-level keys (tests check them; install refuses records without them)
RECORD_KEYS = (
    "schema", "name", "status", "scale", "seed", "device", "data", "config", "environment", "libraries",
    "tokenizer", "target", "medusa", "trees", "acceptance", "draft", "sizes_bytes", "checks", "passed",
    "wall_time_s",
)
PARTS = ("target", "medusa", "draft", "trees")  # what the Medusa and draft stages ship; the EAGLE stage's HEAD_DIRS follow
MAX_TOTAL_BYTES = 50_000_000  # the zoo ships inside the package and travels with it to GPU machines (issue #14: 50 MB)
_LIBRARIES = ("torch", "transformers", "tokenizers", "safetensors", "tqdm", "specbench")
LOSS_CURVE_POINTS = 100


def library_versions() -> dict[str, str | None]:
    import specbench

    versions = {}
    for name in _LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    versions["specbench"] = versions["specbench"] or specbench.__version__  # run from a checkout, not installed
    return versions


def loss_summary(losses: list[float]) -> dict:
    """Steps, the first and final losses (final = mean of the last 5% of steps) and a curve of at
    most LOSS_CURVE_POINTS window means, small enough to keep in the record."""
    if not losses:
        return {"steps": 0, "first_loss": None, "final_loss": None, "loss_curve": []}
    window = max(1, math.ceil(len(losses) / LOSS_CURVE_POINTS))
    curve = [sum(losses[i : i + window]) / len(losses[i : i + window]) for i in range(0, len(losses), window)]
    tail = losses[-max(1, len(losses) // 20) :]
    return {
        "steps": len(losses),
        "first_loss": losses[0],
        "final_loss": sum(tail) / len(tail),
        "loss_curve_window": window,
        "loss_curve": [round(x, 5) for x in curve],
    }


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size


class StageTimer:
    """Wall time of each named build stage, in seconds."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        begin = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = round(time.perf_counter() - begin, 3)

    def total(self) -> dict[str, float]:
        return {**self.seconds, "total": round(time.perf_counter() - self.start, 3)}


def write_record(directory: Path, record: dict) -> Path:
    """Write ``record`` as strict JSON (NaN -> null) atomically; checks it holds every RECORD_KEYS key."""
    missing = [key for key in RECORD_KEYS if key not in record]
    if missing:
        raise ValueError(f"build record for {directory} lacks key(s) {missing}; this is a bug in the zoo build")
    path = directory / RECORD_FILE
    write_text_atomic(path, strict_json.dumps(record) + "\n")
    return path


def read_record(directory: Path) -> dict:
    """The record of a build directory (or the record file itself), checked for RECORD_KEYS."""
    path = directory if directory.is_file() else directory / RECORD_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: {directory} is not a finished zoo build (run `specbench zoo build`)")
    record = json.loads(path.read_text(encoding="utf-8"))
    missing = [key for key in RECORD_KEYS if key not in record]
    if missing:
        raise ValueError(f"{path}: key(s) {missing} missing; expected a record written by `specbench zoo build`")
    return record


# what a rebuild with the same seed must reproduce (written into each record's `reproducibility`, and what
# `specbench zoo compare` checks for records that predate it): CUDA training kernels are not deterministic,
# so on GPUs the quality metrics must agree within the suites' quality gate tolerance
REPRODUCED_METRICS = ("acceptance.chain_k3.acceptance_rate", "acceptance.tree_63.mean_acceptance_length")
CUDA_QUALITY_TOLERANCE = DEFAULT_TOLERANCES["acceptance_rate"]


def _lookup(record: dict, dotted: str, where: str) -> float:
    value = record
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            raise KeyError(f"{where}: no {dotted!r} (missing {key!r}); is it a full `specbench zoo build` record?")
        value = value[key]
    return float(value)


def compare_records(reference: dict, rebuild: dict, *, names: tuple[str, str] = ("reference", "rebuild")) -> dict:
    """Does ``rebuild`` reproduce ``reference``'s quality metrics within the tolerance the records state?

    Same seed and scale required. Both on CPU: the metrics must be equal (CPU builds are bit-identical);
    otherwise within the relative ``reproducibility.cuda_quality_tolerance`` (the rebuild's, else the
    reference's, else 5%). Returns {"tolerance", "rows": [{metric, reference, rebuild, relative_change, ok}],
    "reproduced"}; raises ValueError when the two builds were not meant to agree (other seed or scale).
    """
    for key in ("seed", "scale"):
        if reference[key] != rebuild[key]:
            raise ValueError(f"{names[1]} has {key} {rebuild[key]!r} but {names[0]} has {reference[key]!r}: "
                             "only a rebuild with the same seed and scale is expected to reproduce the metrics")
    rules = rebuild.get("reproducibility") or reference.get("reproducibility") or {}
    both_cpu = str(reference["device"]).startswith("cpu") and str(rebuild["device"]).startswith("cpu")
    tolerance = 0.0 if both_cpu else float(rules.get("cuda_quality_tolerance", CUDA_QUALITY_TOLERANCE))
    rows = []
    for metric in rules.get("metrics", REPRODUCED_METRICS):
        old, new = _lookup(reference, metric, names[0]), _lookup(rebuild, metric, names[1])
        change = (new - old) / old if old else (0.0 if new == old else math.inf)
        rows.append({"metric": metric, "reference": old, "rebuild": new, "relative_change": change,
                     "ok": abs(change) <= tolerance + 1e-12})
    return {"tolerance": tolerance, "rows": rows, "reproduced": all(r["ok"] for r in rows)}


def part_digests(build: Path, parts: tuple[str, ...]) -> dict[str, str]:
    """sha256 of every file under the build's ``parts`` (relative path -> hex digest), to prove them unchanged."""
    digests = {}
    for part in parts:
        for path in sorted((build / part).rglob("*")) if (build / part).is_dir() else [build / part]:
            if path.is_file():
                digests[str(path.relative_to(build))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


def commit_parts(build: Path, staging: Path, parts: tuple[str, ...], record: dict) -> None:
    """Move ``staging/<part>`` to ``build/<part>`` for each part (earlier ones moved aside first), then rewrite the
    record atomically; on any failure the earlier parts and record are put back, so a reader sees the old build or
    the new one, never a part of each."""
    retired = Path(tempfile.mkdtemp(prefix=".retired.", dir=build))
    moved: list[str] = []
    try:
        for part in parts:
            if (build / part).exists():
                os.replace(build / part, retired / part)
            os.replace(staging / part, build / part)
            moved.append(part)
        write_record(build, record)
    except BaseException:
        for part in reversed(moved):
            os.replace(build / part, staging / part)
        for part in parts:
            if (retired / part).exists() and not (build / part).exists():
                os.replace(retired / part, build / part)
        raise
    finally:
        shutil.rmtree(retired, ignore_errors=True)
