"""Regenerating stored baselines: store a run as its case's baseline, atomically, under a directory lock,
with provenance and a printable old -> new diff per metric (the file format is in specbench.gating.baselines)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from specbench.io import strict_json
from specbench.io.atomic_write import write_text_atomic
from specbench.io.file_lock import locked
from specbench.gating.baselines import (
    FLOAT_SIGNIFICANT_DIGITS, QUALITY_REQUEST_FIELDS, SCHEMA_VERSION, SPEED_REQUEST_FIELDS, BaselineError,
    BaselineRefused, as_result_dict, as_store, case_changes, format_baseline_file, result_case_id, split_case_id,
)
from specbench.gating.intervals import first_repeat, per_token_latency
from specbench.gating.gates import QUALITY_METRICS, SPEED_METRICS, check_correctness, resolve_tolerances


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
    reason: str | None = None  # why it was regenerated, as recorded in the provenance
    lines: list[DiffLine] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> list[DiffLine]:
        return [line for line in self.lines if line.changed]

    def format(self) -> str:
        head = f"{self.case_id} -> {self.path}" + (" (new baseline)" if self.created else "")
        reason = [f"  reason: {self.reason}"] if self.reason else []
        return "\n".join([head] + reason + ["  " + line.format() for line in self.lines]
                          + ["  note: " + n for n in self.notes])

    __str__ = format


def _provenance(result: dict, command: str, reason: str | None) -> dict:
    env = result.get("env") or {}
    date = result.get("created_at") or datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"git_commit": env.get("git_commit"), "date": date, "command": command, "reason": reason, "env": env}


def require_reason(reason, flag: str = "--reason") -> str:
    """``reason`` stripped; a missing or blank one raises BaselineError saying to pass ``flag``: a baseline is
    re-based deliberately, and why is recorded in its provenance."""
    if not isinstance(reason, str) or not reason.strip():
        raise BaselineError(f"storing baselines needs a reason: pass {flag} \"TEXT\" saying why they change (e.g. "
                            f"{flag} \"new verify kernel, measured faster\"); it is recorded in each entry's provenance")
    return reason.strip()


def _sections(result: dict, command: str, reason: str | None = None) -> tuple[dict, dict]:
    metrics, requests = result.get("metrics") or {}, result.get("requests") or []
    provenance = _provenance(result, command, reason)
    correctness = result.get("correctness") or {}
    quality = {
        "metrics": {name: metrics.get(name) for name in QUALITY_METRICS},
        "requests": [{key: r.get(key, i if key == "prompt_id" else None) for key in QUALITY_REQUEST_FIELDS}
                     for i, r in enumerate(first_repeat(requests))],  # every repeat decodes the same tokens
        "correctness": {key: correctness.get(key) for key in ("checked", "exact", "match_fraction")},
        "provenance": provenance,
    }
    speed = {
        "metrics": {name: metrics.get(name) for name in SPEED_METRICS},
        "requests": [{**{key: r.get(key, i if key == "prompt_id" else None) for key in SPEED_REQUEST_FIELDS},
                      "repeat": r.get("repeat") or 0, "per_token_latency_s": per_token_latency(r)}
                     for i, r in enumerate(requests)],
        "repeats": [dict(record) for record in result.get("repeats") or []],
        "provenance": provenance,
    }
    return (strict_json.json_safe(quality, FLOAT_SIGNIFICANT_DIGITS), strict_json.json_safe(speed, FLOAT_SIGNIFICANT_DIGITS))


def baseline_entry(result: dict, *, command: str, reason: str | None = None) -> dict:
    """The entry ``update_baseline`` would store for ``result`` (no file touched): benchmarks gate later runs
    against an earlier run of the same process with ``gates.compare_entry(later, baseline_entry(first, ...))``.
    Held in memory only, so it needs no reason."""
    result = as_result_dict(result)
    quality, speed = _sections(result, command, reason)
    hardware_class = (result.get("env") or {}).get("hardware_class")
    return {"case": result.get("case") or {}, "quality": quality, "speed": {hardware_class: speed} if hardware_class else {}}


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


def update_baseline(result: dict, store_dir=None, *, command: str, reason: str) -> BaselineDiff:
    """Store ``result`` as its case's baseline: quality (if changed), and speed for its hardware class.

    Other hardware classes' speed figures and the per-case tolerances are kept. Raises BaselineRefused
    when the run's correctness check fails (fp32 not exact, or bf16/fp16 under the minimum match fraction).
    ``command`` (the command line that produced the run) and ``reason`` (why the baseline changes; required,
    BaselineError when blank) are recorded in the provenance.
    """
    reason = require_reason(reason)
    store, result = as_store(store_dir), as_result_dict(result)
    case_id = result_case_id(result)
    suite, name = split_case_id(case_id)
    hardware_class = (result.get("env") or {}).get("hardware_class")
    if not hardware_class:
        raise BaselineError(f"cannot store {case_id}: the result has no env.hardware_class, so its speed "
                            "figures cannot be filed; produce the result with specbench's harness")
    store.directory.mkdir(parents=True, exist_ok=True)
    path = store.path(suite)
    # serialise updaters of one directory (pytest-xdist workers), so no read-modify-write is lost; the lock
    # file sits beside the directory (baselines.lock), which holds only baseline files, and is released by
    # the OS if this process is killed
    with locked(store.directory):
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
        quality, speed = _sections(result, command, reason)
        diff = BaselineDiff(case_id, path, created=old is None, reason=reason)
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
