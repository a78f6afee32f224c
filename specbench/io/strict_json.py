"""Strict JSON for results, history records, build records and baselines: non-finite floats
(an acceptance rate with nothing drafted is NaN) are written as null, never as bare NaN."""

from __future__ import annotations

import json
import math


def json_safe(value, significant_digits: int | None = None):
    """A JSON-ready copy: NaN/inf -> None, tuples -> lists, dict keys -> str; floats optionally
    rounded to ``significant_digits`` (so files regenerated from reruns diff small)."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return float(f"{value:.{significant_digits}g}") if significant_digits else value
    if isinstance(value, dict):
        return {str(k): json_safe(v, significant_digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v, significant_digits) for v in value]
    return value


def dumps(value, *, indent: int | None = 2, significant_digits: int | None = None) -> str:
    """Sorted-key JSON text of ``json_safe(value)``; ``indent=None`` gives one line."""
    return json.dumps(json_safe(value, significant_digits), indent=indent, sort_keys=True, allow_nan=False, ensure_ascii=False)
