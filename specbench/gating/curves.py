"""Batch-size curves by name: a point's case id is its curve's id with ``[batch_size=B]`` appended (cases.changed_name)."""

from __future__ import annotations

import re

_POINT = re.compile(r"^(?P<curve>.+)\[batch_size=(?P<size>\d+)\]$")


def curve_name(case_id: str) -> str:
    """A point's case id without its ``[batch_size=B]`` part (the swept case's id); any other id unchanged."""
    match = _POINT.match(case_id)
    return match["curve"] if match else case_id


def point_batch_size(case_id: str) -> int | None:
    """The B of a point's case id ``NAME[batch_size=B]``, None for an id that is not a point."""
    match = _POINT.match(case_id)
    return int(match["size"]) if match else None
