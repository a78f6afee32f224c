"""The results history: a directory of JSON-lines files, one record per case run, appended by any number of
concurrent writers (pytest-xdist workers, CI jobs) and read back as one pandas DataFrame.

Each writer process appends to its own ``records-<random id>.jsonl`` (the id is a fresh uuid4 per process,
so it names no host and survives fork), one whole line per ``os.write`` on an ``O_APPEND`` descriptor under
an exclusive lock on ``records-<id>.jsonl.lock`` (:func:`specbench.io.file_lock.locked`): the lock serialises
threads of one process and any writers sharing one file, the file per process means a writer killed mid-line
can only truncate its own last line, which :func:`load_history` skips with a warning.
Appends cannot use the project's temp-file + ``os.replace`` rule: that would rewrite the whole file per run
and lose records written between the read and the replace.

A record (schema 1)::

    {"schema": 1, "case_id": "medusa/medusa-chain-k3", "suite": "medusa", "case": "medusa-chain-k3",
     "case_definition": {...}, "hardware_class": "NVIDIA H200", "git_commit": "0123abc", "git_dirty": false,
     "created_at": "2026-11-30T10:00:00Z", "recorded_at": "...",
     "metrics": {...the run's aggregates, per_position_acceptance_rate included...},
     "correctness": {...}, "requests": [{compact per-request counters and timings, as baselines store}],
     "gate": {"passed": bool, "has_baseline": bool, "statuses": {check: status}, "failures": [message]} | null,
     "env": {...environment fingerprint...}, "details": {...}}
"""

from __future__ import annotations

import json
import math
import os
import uuid
import warnings
from datetime import datetime, timezone
from pathlib import Path

from specbench.io.file_lock import locked, signals_held
from specbench.gating.baselines import QUALITY_REQUEST_FIELDS, SPEED_REQUEST_FIELDS
from specbench.io.strict_json import json_safe
from specbench.gating.intervals import per_token_latency
from specbench.gating.gates import QUALITY_METRICS, SPEED_METRICS
from specbench.io.jsonl import describe_json_error
from specbench.metrics import METRIC_NAMES

HISTORY_SCHEMA = 1
HISTORY_DIR_ENV = "SPECBENCH_HISTORY_DIR"
RECORD_GLOB = "*.jsonl"
REQUIRED_KEYS = ("case_id", "metrics", "created_at")
# the DataFrame's fixed columns, before one column per scalar metric
BASE_COLUMNS = ("case_id", "suite", "case", "hardware_class", "git_commit", "git_dirty", "created_at", "gate_passed",
                "gate_failures", "correctness", "env", "case_definition", "requests", "repeats", "flags", "source")
REQUEST_FIELDS = tuple(dict.fromkeys((*QUALITY_REQUEST_FIELDS, *SPEED_REQUEST_FIELDS, "per_token_latency_s")))


class HistoryError(ValueError):
    """A history directory, record or results file that cannot be used (bad input: exit code 2)."""


class TruncatedRecordWarning(UserWarning):
    """A record line cut short (its writer died mid-write); the line is skipped."""


def default_history_dir() -> Path:
    """``$SPECBENCH_HISTORY_DIR``, else ``.specbench/history`` under the repo root (nearest pyproject.toml)."""
    if os.environ.get(HISTORY_DIR_ENV):
        return Path(os.environ[HISTORY_DIR_ENV])
    cwd = Path.cwd().resolve()
    for directory in (cwd, *cwd.parents):
        if (directory / "pyproject.toml").is_file():
            return directory / ".specbench" / "history"
    return cwd / ".specbench" / "history"


def _gate_outcome(report) -> dict | None:
    if report is None:
        return None
    report = report.to_dict() if hasattr(report, "to_dict") else report
    checks = report.get("checks") or []
    return {
        "passed": bool(report.get("passed")),
        "has_baseline": bool(report.get("has_baseline")),
        "statuses": {c["name"]: c["status"] for c in checks},
        "failures": [c.get("message") or c["name"] for c in checks if c.get("status") in ("regression", "fail")],
    }


def history_record(result: dict, gate_report=None) -> dict:
    """The history record of one run result (RESULT_SCHEMA dict or harness.RunResult) and its GateReport."""
    result = result.to_dict() if hasattr(result, "to_dict") else result
    case, env = result.get("case") or {}, result.get("env") or {}
    case_id = result.get("case_id") or f"{case.get('suite')}/{case.get('name')}"
    suite, _, name = case_id.partition("/")
    requests = [{**{k: r.get(k) for k in REQUEST_FIELDS if k != "per_token_latency_s"},
                 "per_token_latency_s": per_token_latency(r)} for r in result.get("requests") or []]
    return json_safe({
        "schema": HISTORY_SCHEMA,
        "case_id": case_id, "suite": suite, "case": name, "case_definition": case,
        "hardware_class": env.get("hardware_class"), "git_commit": env.get("git_commit"),
        "git_dirty": env.get("git_dirty"),
        "created_at": result.get("created_at") or _now(), "recorded_at": _now(),
        "metrics": result.get("metrics") or {},
        "correctness": {k: v for k, v in (result.get("correctness") or {}).items()},
        "requests": requests,
        "gate": _gate_outcome(gate_report),
        "env": env, "details": result.get("details") or {},
        "repeats": result.get("repeats") or [], "flags": result.get("flags") or [],
    })


def result_from_row(row) -> dict:
    """A RESULT_SCHEMA-shaped dict rebuilt from one :func:`load_history` row (compact requests), so a stored
    run can be gated again against today's baselines."""
    metrics = {name: (None if isinstance(value, float) and math.isnan(value) else value)
               for name, value in row.items() if name not in BASE_COLUMNS}
    created_at = row["created_at"]
    return {"schema": 1, "case": row["case_definition"], "case_id": row["case_id"], "metrics": metrics,
            "requests": row["requests"], "correctness": row["correctness"], "env": row["env"],
            "repeats": row["repeats"], "flags": row["flags"],
            "created_at": created_at.strftime("%Y-%m-%dT%H:%M:%SZ") if hasattr(created_at, "strftime") else created_at}


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


_writer = {"pid": None, "name": None}


def writer_file_name() -> str:
    """This process's own records file name (new after a fork: the child must not share its parent's file)."""
    if _writer["pid"] != os.getpid():
        _writer.update(pid=os.getpid(), name=f"records-{uuid.uuid4().hex}.jsonl")
    return _writer["name"]


def append_results(history_dir, results: list, *, gate_reports: list | None = None) -> Path:
    """Append one record per result (dicts or RunResults) to this process's file in ``history_dir``.

    ``gate_reports``: GateReports (or their dicts), one per result in the same order, or None.
    Returns the file written. Each record is one complete line; the batch is one write under the lock.
    """
    if gate_reports is not None and len(gate_reports) != len(results):
        raise HistoryError(f"append_results: {len(results)} results but {len(gate_reports)} gate reports; "
                           "pass one report per result, in the same order, or none")
    reports = gate_reports if gate_reports is not None else [None] * len(results)
    lines = [json.dumps(history_record(r, g), sort_keys=True, allow_nan=False) + "\n" for r, g in zip(results, reports)]
    directory = Path(history_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / writer_file_name()
    data = "".join(lines).encode("utf-8")
    with locked(path), signals_held():  # Ctrl-C during the write would cut a batch of records in two
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            view = memoryview(data)
            while view:  # a regular file takes it all at once; the loop only guards against a signal's short write
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
    return path


def read_records(history_dir) -> list[tuple[dict, str]]:
    """(record, "file:line") of every record in ``history_dir``, files in name order.

    A last line without its newline that does not parse is skipped with a TruncatedRecordWarning; any other
    bad line raises HistoryError naming the file and line.
    """
    directory = Path(history_dir)
    if not directory.is_dir():
        raise HistoryError(f"history directory {directory} does not exist; create it by recording runs "
                           "(`specbench check --results R.jsonl --history DIR`) or pass --history DIR")
    out = []
    for path in sorted(directory.glob(RECORD_GLOB)):
        text = path.read_text(encoding="utf-8", errors="replace")
        lines = text.split("\n")
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            last_unterminated = number == len(lines)  # text after the final newline
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                if last_unterminated:
                    warnings.warn(f"{path}:{number}: skipped a truncated last line ({len(line)} characters, no "
                                  "newline): its writer was probably killed mid-write", TruncatedRecordWarning,
                                  stacklevel=2)
                    continue
                raise HistoryError(f"{path}:{number}: not a JSON record, {describe_json_error(err)}; "
                                   "delete that line or move the file out of the history directory") from None
            missing = [k for k in REQUIRED_KEYS if not isinstance(record, dict) or k not in record]
            if missing:
                found = sorted(record) if isinstance(record, dict) else type(record).__name__
                raise HistoryError(f"{path}:{number}: record lacks {missing} (expected keys {list(REQUIRED_KEYS)}, "
                                   f"found {found}); is this a history file?")
            out.append((record, f"{path.name}:{number}"))
    return out


def _per_position(metrics: dict) -> list[float]:
    values = metrics.get("per_position_acceptance_rate") or []
    return [math.nan if v is None else float(v) for v in values]


def load_history(history_dir):
    """One DataFrame row per recorded run, oldest first.

    Columns: BASE_COLUMNS (``created_at`` a UTC timestamp, ``gate_passed`` True/False/None), then one float
    column per scalar metric (null -> NaN) and ``per_position_acceptance_rate`` as a list column.
    """
    import pandas as pd

    # the known metrics always get a column, so an empty or older history still has them
    rows = []
    metric_names = dict.fromkeys(n for n in (*METRIC_NAMES, *QUALITY_METRICS, *SPEED_METRICS, "plain_tokens_per_s",
                                             "num_requests", "num_output_tokens")
                                 if n != "per_position_acceptance_rate")
    for record, source in read_records(history_dir):
        metrics, gate = record.get("metrics") or {}, record.get("gate")
        correctness = record.get("correctness") or {}
        row = {
            "case_id": record["case_id"], "suite": record.get("suite"), "case": record.get("case"),
            "hardware_class": record.get("hardware_class") or "unknown", "git_commit": record.get("git_commit"),
            "git_dirty": record.get("git_dirty"), "created_at": record["created_at"],
            "gate_passed": None if gate is None else gate.get("passed"),
            "gate_failures": [] if gate is None else gate.get("failures") or [],
            "correctness": correctness,
            "env": record.get("env") or {}, "case_definition": record.get("case_definition") or {},
            "requests": record.get("requests") or [], "source": source,
            "repeats": record.get("repeats") or [], "flags": record.get("flags") or [],
            "per_position_acceptance_rate": _per_position(metrics),
        }
        for name, value in metrics.items():
            if name != "per_position_acceptance_rate" and (value is None or isinstance(value, (int, float))):
                metric_names[name] = None
                row[name] = math.nan if value is None else float(value)
        rows.append(row)
    columns = [*BASE_COLUMNS, *metric_names, "per_position_acceptance_rate"]
    # object columns keep None as None (pandas' string dtype would turn a missing commit into NaN)
    frame = pd.DataFrame(rows, columns=columns, dtype=object)
    frame = frame.astype({name: float for name in metric_names})
    frame["created_at"] = pd.to_datetime(frame["created_at"], utc=True, format="ISO8601")
    # stable: equal timestamps keep file-then-line order
    frame = frame.sort_values("created_at", kind="stable").reset_index(drop=True)
    return frame
