"""Stored baselines: one reviewed JSON file per suite, checked on load, compared through specbench.gates,
and regenerated atomically with provenance.

``baselines/<suite>.json`` (pretty-printed, sorted keys, floats to 6 significant digits, NaN as null)::

    {"schema": 1, "suite": "medusa", "cases": {"medusa-chain-k3": {
        "case": {...},              # the case dict it was recorded for; a different one is an error
        "tolerances": {...},        # optional per-case overrides of gates.DEFAULT_TOLERANCES, hand-edited
        "quality": {                # hardware-independent, stored once
            "metrics": {acceptance_rate, mean_acceptance_length, per_position_acceptance_rate},
            "requests": [{prompt_id, num_drafts, num_draft_tokens, num_accepted_tokens, accepted_per_position}],
            "correctness": {checked, exact, match_fraction},
            "provenance": {git_commit, date, command, env}},
        "speed": {"<env.hardware_class>": {
            "metrics": {tokens_per_s, speedup, time_to_first_token_s, per_token_latency_s},
            "requests": [{prompt_id, tokens_per_s, plain_tokens_per_s, time_to_first_token_s, per_token_latency_s}],
            "provenance": {...}}}}}}

The per-request values let the gates bootstrap a confidence interval of the difference to the baseline.
"""

from __future__ import annotations

import json
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from specbench import strict_json
from specbench.atomic_write import write_text_atomic
from specbench.gate_intervals import DEFAULT_CONFIDENCE, DEFAULT_NUM_RESAMPLES, per_token_latency
from specbench.gates import (
    QUALITY_METRICS, SPEED_METRICS, GateReport, check_correctness, compare_entry, resolve_tolerances,
)

SCHEMA_VERSION = 1
FLOAT_SIGNIFICANT_DIGITS = 6
BASELINES_DIR_ENV = "SPECBENCH_BASELINES_DIR"
# case keys that decide how a run is judged or scheduled, not what it measures: editing them keeps the baseline
NON_DEFINING_CASE_KEYS = ("tolerances", "gate_quality", "gate_speed", "min_gpu_gib", "description", "quality_baseline")
# what a case's quality reference (``quality_baseline``) may differ in: where it runs, not what it computes
QUALITY_REFERENCE_FREE_KEYS = ("name", "device")
REGENERATE_HINT = ("regenerate it with `specbench baselines regenerate <suite>` (or `specbench run <case> "
                   "--update-baselines`, or pytest `--specbench-update-baselines`), or restore it from git")

QUALITY_REQUEST_FIELDS = ("prompt_id", "num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_position")
SPEED_REQUEST_FIELDS = ("prompt_id", "tokens_per_s", "plain_tokens_per_s", "time_to_first_token_s", "per_token_latency_s")
PROVENANCE_FIELDS = ("git_commit", "date", "command", "env")
_SUITE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


class BaselineError(Exception):
    """Base of every error this module raises."""


class BaselineFileError(BaselineError):
    """A baseline file that is not valid JSON or lacks a key."""


class CaseDefinitionChanged(BaselineError):
    """The case was edited since its baseline was recorded."""


class BaselineRefused(BaselineError):
    """update_baseline would have stored a run whose correctness check failed."""


def default_baselines_dir() -> Path:
    """``$SPECBENCH_BASELINES_DIR``, else ``baselines/`` in the nearest ancestor of the working directory
    holding a pyproject.toml (the repo root), else ``./baselines``."""
    if os.environ.get(BASELINES_DIR_ENV):
        return Path(os.environ[BASELINES_DIR_ENV])
    cwd = Path.cwd().resolve()
    for directory in (cwd, *cwd.parents):
        if (directory / "pyproject.toml").is_file():
            return directory / "baselines"
    return cwd / "baselines"


def split_case_id(case_id: str) -> tuple[str, str]:
    suite, sep, name = case_id.partition("/")
    if not sep or not name or not _SUITE_NAME.match(suite):
        raise BaselineError(f"case id {case_id!r} is not '<suite>/<name>' with a file-name-safe suite "
                            f"(letters, digits, '_', '.', '-')")
    return suite, name


def _as_result_dict(result) -> dict:
    """Accept harness.RunResult as well as its dict form."""
    return result.to_dict() if hasattr(result, "to_dict") else result


def result_case_id(result: dict) -> str:
    case = result.get("case") or {}
    return result.get("case_id") or f"{case.get('suite')}/{case.get('name')}"


# ---- file format ---------------------------------------------------------------------------------------


def format_baseline_file(data: dict) -> str:
    """The exact text stored: same data, same bytes."""
    return strict_json.dumps(data, significant_digits=FLOAT_SIGNIFICANT_DIGITS) + "\n"


def _require(obj, keys, where: str, path: Path, kind=dict):
    if not isinstance(obj, kind):
        raise BaselineFileError(f"{path}: '{where or '<top level>'}' must be a JSON "
                                f"{'object' if kind is dict else 'array'}, found {type(obj).__name__}; {REGENERATE_HINT}")
    for key in keys:
        if key not in obj:
            raise BaselineFileError(f"{path}: missing key '{where + '.' if where else ''}{key}' (expected "
                                    f"{list(keys)}, found {sorted(obj)}); {REGENERATE_HINT}")
    return obj


def _is_number(x) -> bool:
    return x is None or (isinstance(x, (int, float)) and not isinstance(x, bool))  # null: NaN when recorded


def _validate_section(section, where, path, metric_names, request_fields, extra_keys=()):
    _require(section, ("metrics", "requests", "provenance", *extra_keys), where, path)
    for name, value in _require(section["metrics"], metric_names, f"{where}.metrics", path).items():
        if not all(map(_is_number, value if isinstance(value, list) else [value])):
            raise BaselineFileError(f"{path}: key '{where}.metrics.{name}' must be a number, null or a list of "
                                    f"numbers, found {value!r}; {REGENERATE_HINT}")
    for i, request in enumerate(_require(section["requests"], (), f"{where}.requests", path, kind=list)):
        _require(request, request_fields, f"{where}.requests[{i}]", path)
    _require(section["provenance"], PROVENANCE_FIELDS, f"{where}.provenance", path)


def validate_baseline_file(data, path: Path) -> dict:
    """Raise BaselineFileError naming the file and the first missing or mistyped key."""
    _require(data, ("schema", "suite", "cases"), "", path)
    if data["schema"] != SCHEMA_VERSION:
        raise BaselineFileError(f"{path}: key 'schema' is {data['schema']!r}, expected {SCHEMA_VERSION}; {REGENERATE_HINT}")
    for name, entry in _require(data["cases"], (), "cases", path).items():
        where = f"cases.{name}"
        _require(entry, ("case", "quality", "speed"), where, path)
        try:
            resolve_tolerances(entry.get("tolerances"))
        except ValueError as err:
            raise BaselineFileError(f"{path}: key '{where}.tolerances': {err}; fix the override by hand") from None
        _validate_section(entry["quality"], f"{where}.quality", path, QUALITY_METRICS, QUALITY_REQUEST_FIELDS,
                          extra_keys=("correctness",))
        for hardware_class, speed in _require(entry["speed"], (), f"{where}.speed", path).items():
            _validate_section(speed, f"{where}.speed.{hardware_class}", path, SPEED_METRICS, SPEED_REQUEST_FIELDS)
    return data


# ---- the store -----------------------------------------------------------------------------------------


class BaselineStore:
    """A directory of ``<suite>.json`` baseline files (default: :func:`default_baselines_dir`)."""

    def __init__(self, directory: str | os.PathLike | None = None):
        self.directory = Path(directory) if directory is not None else default_baselines_dir()

    def path(self, suite: str) -> Path:
        split_case_id(f"{suite}/_")  # validates the suite name
        return self.directory / f"{suite}.json"

    def load(self, suite: str) -> dict | None:
        """The validated content of the suite's file, None when it does not exist."""
        path = self.path(suite)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise BaselineFileError(f"{path}: not valid JSON ({err.msg} at line {err.lineno}, column {err.colno}); "
                                    f"{REGENERATE_HINT}") from None
        return validate_baseline_file(data, path)

    def entry(self, case_id: str) -> dict | None:
        suite, name = split_case_id(case_id)
        data = self.load(suite)
        return None if data is None else data["cases"].get(name)

    def case_ids(self) -> list[str]:
        ids = []
        for path in sorted(self.directory.glob("*.json")):
            data = self.load(path.stem)
            ids.extend(f"{path.stem}/{name}" for name in sorted(data["cases"]))
        return ids


def _as_store(store) -> BaselineStore:
    return store if isinstance(store, BaselineStore) else BaselineStore(store)


def _defining(case: dict) -> dict:
    # canonical on both sides: the stored copy went through the same float rounding
    return strict_json.json_safe({k: v for k, v in (case or {}).items() if k not in NON_DEFINING_CASE_KEYS}, FLOAT_SIGNIFICANT_DIGITS)


def case_changes(stored_case: dict, case: dict) -> list[str]:
    """Human-readable differences between two case definitions ([] when they define the same run)."""
    old, new = _defining(stored_case), _defining(case)
    return [f"{key}: baseline {old.get(key, '<absent>')!r}, now {new.get(key, '<absent>')!r}"
            for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)]


def compare(result: dict, baseline_store=None, *, tolerances: dict | None = None,
            confidence: float = DEFAULT_CONFIDENCE, num_resamples: int = DEFAULT_NUM_RESAMPLES,
            seed: int = 0) -> GateReport:
    """Gate a run result (RESULT_SCHEMA dict) against its stored baseline.

    ``baseline_store``: a BaselineStore or a directory (None: the default directory). Tolerances are
    gates.DEFAULT_TOLERANCES, updated by the baseline file's per-case ``tolerances``, then the case's own
    ``tolerances``, then the ``tolerances`` argument. Raises CaseDefinitionChanged when the baseline was
    recorded for a different case definition, BaselineFileError for a broken file.
    """
    store, result = _as_store(baseline_store), _as_result_dict(result)
    case_id = result_case_id(result)
    suite, _ = split_case_id(case_id)
    entry = store.entry(case_id)
    if entry is not None:
        changes = case_changes(entry["case"], result.get("case") or {})
        if changes:
            raise CaseDefinitionChanged(
                f"{store.path(suite)}: the baseline of {case_id} was recorded for a different case definition "
                f"({'; '.join(changes)}); {REGENERATE_HINT}")
    quality_from = None
    reference = (result.get("case") or {}).get("quality_baseline")
    if reference:
        quality_from = _quality_reference(store, suite, case_id, result.get("case") or {}, reference)
    return compare_entry(result, entry, tolerances=tolerances, confidence=confidence, num_resamples=num_resamples,
                         seed=seed, baseline_path=str(store.path(suite)), quality_from=quality_from)


def _quality_reference(store: BaselineStore, suite: str, case_id: str, case: dict, reference: str) -> tuple[str, dict | None]:
    """(reference case id, its stored entry or None) for a case gated on another case's quality baseline.

    A GPU fp32 twin of a CPU case must reproduce the CPU acceptance: the two must define the same run
    apart from QUALITY_REFERENCE_FREE_KEYS, else the comparison would be meaningless and this raises.
    """
    reference_id = f"{suite}/{reference}"
    entry = store.entry(reference_id)
    if entry is not None:
        free = set(QUALITY_REFERENCE_FREE_KEYS)
        changes = [c for c in case_changes(entry["case"], case) if c.split(":", 1)[0] not in free]
        if changes:
            raise CaseDefinitionChanged(
                f"{store.path(suite)}: {case_id} takes its quality baseline from {reference_id}, but the two cases "
                f"differ in more than {', '.join(QUALITY_REFERENCE_FREE_KEYS)} ({'; '.join(changes)}); make them "
                f"describe the same run on another device, or drop quality_baseline from {case_id}")
    return reference_id, entry


# ---- regeneration --------------------------------------------------------------------------------------


@dataclass
class DiffLine:
    section: str  # "quality" or "speed[<hardware_class>]"
    metric: str
    old: object
    new: object

    @property
    def changed(self) -> bool:
        return self.old != self.new

    def format(self) -> str:
        show = lambda v: "none" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v)  # noqa: E731
        if not self.changed:
            return f"{self.section} {self.metric}: {show(self.new)} (unchanged)"
        numbers = all(isinstance(v, (int, float)) for v in (self.old, self.new)) and self.old
        relative = f" ({(self.new - self.old) / abs(self.old) * 100:+.1f}%)" if numbers else ""
        return f"{self.section} {self.metric}: {show(self.old)} -> {show(self.new)}{relative}"


@dataclass
class BaselineDiff:
    """What update_baseline changed, printable old -> new per metric."""

    case_id: str
    path: Path
    created: bool
    lines: list[DiffLine] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> list[DiffLine]:
        return [line for line in self.lines if line.changed]

    def format(self) -> str:
        head = f"{self.case_id} -> {self.path}" + (" (new baseline)" if self.created else "")
        return "\n".join([head] + ["  " + line.format() for line in self.lines] + ["  note: " + n for n in self.notes])

    __str__ = format


def _provenance(result: dict, command: str) -> dict:
    env = result.get("env") or {}
    date = result.get("created_at") or datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"git_commit": env.get("git_commit"), "date": date, "command": command, "env": env}


def _sections(result: dict, command: str) -> tuple[dict, dict]:
    metrics, requests = result.get("metrics") or {}, result.get("requests") or []
    provenance = _provenance(result, command)
    correctness = result.get("correctness") or {}
    quality = {
        "metrics": {name: metrics.get(name) for name in QUALITY_METRICS},
        "requests": [{key: r.get(key, i if key == "prompt_id" else None) for key in QUALITY_REQUEST_FIELDS}
                     for i, r in enumerate(requests)],
        "correctness": {key: correctness.get(key) for key in ("checked", "exact", "match_fraction")},
        "provenance": provenance,
    }
    speed = {
        "metrics": {name: metrics.get(name) for name in SPEED_METRICS},
        "requests": [{**{key: r.get(key, i if key == "prompt_id" else None) for key in SPEED_REQUEST_FIELDS},
                      "per_token_latency_s": per_token_latency(r)} for i, r in enumerate(requests)],
        "provenance": provenance,
    }
    return (strict_json.json_safe(quality, FLOAT_SIGNIFICANT_DIGITS), strict_json.json_safe(speed, FLOAT_SIGNIFICANT_DIGITS))


def _metric_lines(section: str, names, old: dict | None, new: dict) -> list[DiffLine]:
    lines = []
    for name in names:
        old_value, new_value = (old or {}).get(name), new.get(name)
        if isinstance(new_value, list) or isinstance(old_value, list):
            old_list, new_list = old_value or [], new_value or []
            for i in range(max(len(old_list), len(new_list))):
                lines.append(DiffLine(section, f"{name}[{i}]", old_list[i] if i < len(old_list) else None,
                                      new_list[i] if i < len(new_list) else None))
        else:
            lines.append(DiffLine(section, name, old_value, new_value))
    return lines


@contextmanager
def _directory_lock(directory: Path):
    """Serialise updaters of one directory (pytest-xdist workers), so no read-modify-write is lost."""
    try:
        import fcntl
    except ImportError:  # not POSIX: atomic replacement still holds, concurrent updates may race
        yield
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released by the kernel if this process is killed
        yield
    finally:
        os.close(fd)


def update_baseline(result: dict, store_dir=None, *, command: str) -> BaselineDiff:
    """Store ``result`` as its case's baseline: quality (if changed), and speed for its hardware class.

    Other hardware classes' speed figures and the per-case tolerances are kept. Raises BaselineRefused
    when the run's correctness check fails (fp32 not exact, or bf16/fp16 under the minimum match fraction).
    ``command`` is recorded in the provenance (the command line that produced the run).
    """
    store, result = _as_store(store_dir), _as_result_dict(result)
    case_id = result_case_id(result)
    suite, name = split_case_id(case_id)
    hardware_class = (result.get("env") or {}).get("hardware_class")
    if not hardware_class:
        raise BaselineError(f"cannot store {case_id}: the result has no env.hardware_class, so its speed "
                            "figures cannot be filed; produce the result with specbench's harness")
    store.directory.mkdir(parents=True, exist_ok=True)
    path = store.path(suite)
    with _directory_lock(store.directory):
        for stale in store.directory.glob(f".{path.name}.*.tmp"):  # left by a killed writer; we hold the lock
            stale.unlink(missing_ok=True)
        data = store.load(suite) or {"schema": SCHEMA_VERSION, "suite": suite, "cases": {}}
        old = data["cases"].get(name)
        tolerances = (old or {}).get("tolerances") or {}
        minimum = resolve_tolerances(tolerances, (result.get("case") or {}).get("tolerances"))["min_match_fraction"]
        correctness = check_correctness(result, minimum)
        if correctness.failed:
            raise BaselineRefused(f"refusing to store a baseline for {case_id}: {correctness.reason}. "
                                  "A baseline must come from a run that passes its correctness check; fix the "
                                  "divergence (or lower 'min_match_fraction' in the case's tolerances if justified)")
        quality, speed = _sections(result, command)
        diff = BaselineDiff(case_id, path, created=old is None)
        old_speed = dict((old or {}).get("speed") or {})
        changes = case_changes(old["case"], result.get("case") or {}) if old else []
        if changes:
            diff.notes.append(f"case definition changed ({'; '.join(changes)})")
            if set(old_speed) - {hardware_class}:
                diff.notes.append("dropped speed figures recorded for the old definition on: "
                                  + ", ".join(sorted(set(old_speed) - {hardware_class})))
            old_speed = {hardware_class: old_speed[hardware_class]} if hardware_class in old_speed else {}
        old_quality = old["quality"] if old else None
        if old_quality is not None and not changes and {**old_quality, "provenance": None} == {**quality, "provenance": None}:
            quality = old_quality  # unchanged: keep when and where it was first recorded
            diff.notes.append(f"quality unchanged; kept its provenance ({old_quality['provenance']['date']})")
        diff.lines += _metric_lines("quality", QUALITY_METRICS, old_quality and old_quality["metrics"], quality["metrics"])
        diff.lines.append(DiffLine("quality", "match_fraction", old_quality and old_quality["correctness"]["match_fraction"],
                                   quality["correctness"]["match_fraction"]))
        previous = old_speed.get(hardware_class)
        diff.lines += _metric_lines(f"speed[{hardware_class}]", SPEED_METRICS, previous and previous["metrics"],
                                    speed["metrics"])
        if set(old_speed) - {hardware_class}:
            diff.notes.append("kept speed figures for: " + ", ".join(sorted(set(old_speed) - {hardware_class})))
        entry = {"case": result.get("case") or {}, "quality": quality, "speed": {**old_speed, hardware_class: speed}}
        if tolerances:
            entry["tolerances"] = tolerances
        data["cases"][name] = entry
        write_text_atomic(path, format_baseline_file(data))
    return diff
