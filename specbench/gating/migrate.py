"""Baseline file format migrations: an older schema read in memory as the current one, or rewritten on disk.

Schema 2 (repeats and same-run step costs, docs/metrics.md#repeats) adds to every speed section the
metrics ``decode_speedup``, ``verify_cost_ratio`` and ``draft_cost_ratio``, a ``repeats`` list of per-repeat
records, and to each speed request its ``repeat`` and ``plain_per_token_latency_s``. A schema-1 file
recorded none of them: the metrics become null (the gates say "the baseline holds no value" and skip
them until the case is regenerated), every request was repeat 0, and the repeat list is empty. Nothing
a schema-1 file held changes, so every verdict on the old metrics stays the same.

Schema 3 adds ``step_latency_s``, T(1) (the median over repeats of one synchronised plain verify), to every
speed section. Schema-2 files recorded T(1) in each repeat record (``t1_s``), so it is computed from them, as a
run computes it (specbench.run.speed.speed_over_repeats); a section without repeats gets null.

Schema 4 adds the batch-point metrics ``batch_speedup`` and ``throughput_tokens_per_s`` (docs/batching.md) to every
speed section, as null: no stored case ran batched before, so none measured them, and the gates skip them.
"""

from __future__ import annotations

import copy
import math
import statistics

SCHEMA_VERSION = 4
ADDED_SPEED_METRICS = {2: ("decode_speedup", "verify_cost_ratio", "draft_cost_ratio"),
                       4: ("batch_speedup", "throughput_tokens_per_s")}
ADDED_SPEED_REQUEST_FIELDS = {2: {"repeat": 0, "plain_per_token_latency_s": None}}


def _speed_sections(data: dict):
    """Every speed section of every case in ``data``."""
    for entry in (data.get("cases") or {}).values():
        yield from (entry.get("speed") or {}).values()


def _add_null_metrics(data: dict, schema: int) -> None:
    for speed in _speed_sections(data):
        metrics = speed.setdefault("metrics", {})
        for name in ADDED_SPEED_METRICS[schema]:
            metrics.setdefault(name, None)


def _to_2(data: dict) -> None:
    _add_null_metrics(data, 2)
    for speed in _speed_sections(data):
        for request in speed.get("requests") or []:
            for key, value in ADDED_SPEED_REQUEST_FIELDS[2].items():
                request.setdefault(key, value)
        speed.setdefault("repeats", [])


def _to_3(data: dict) -> None:
    for speed in _speed_sections(data):
        steps = [r["t1_s"] for r in speed.get("repeats") or []
                 if isinstance(r.get("t1_s"), (int, float)) and math.isfinite(r["t1_s"])]
        speed.setdefault("metrics", {}).setdefault("step_latency_s", statistics.median(steps) if steps else None)


def _to_4(data: dict) -> None:
    _add_null_metrics(data, 4)


STEPS = {1: _to_2, 2: _to_3, 3: _to_4}  # schema n -> the function that makes it n + 1, in place


def migrate(data: dict) -> tuple[dict, list[int]]:
    """(a copy of ``data`` at SCHEMA_VERSION, the schemas it passed through). A file of an unknown or newer
    schema is returned unchanged, for validation to refuse with its message."""
    schema = data.get("schema") if isinstance(data, dict) else None
    if not isinstance(schema, int) or schema >= SCHEMA_VERSION or schema not in STEPS:
        return data, []
    data, passed = copy.deepcopy(data), []
    while data["schema"] < SCHEMA_VERSION:
        passed.append(data["schema"])
        STEPS[data["schema"]](data)
        data["schema"] += 1
    return data, passed
