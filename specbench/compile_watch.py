"""Counts torch.compile's graph compilations, so that a timed window that compiled something is flagged, not trusted."""

from __future__ import annotations

import torch


def compiled_graphs() -> int:
    """Graphs torch.compile has compiled in this process so far (every stage, specialisation and recompile)."""
    dynamo = getattr(torch, "_dynamo", None)
    counters = getattr(getattr(dynamo, "utils", None), "counters", None)
    return int(counters["stats"]["unique_graphs"]) if counters is not None else 0


def compile_flags(compiled: int, where: str) -> list[dict]:
    """The measurement flag of ``compiled`` compilations inside timed ``where`` (empty when none): their seconds
    are inside the speed figures (docs/metrics.md#gates)."""
    if compiled <= 0:
        return []
    return [{
        "kind": "compiled_while_timed",
        "message": (f"torch.compile compiled {compiled} graph(s) during the {where}: compile time is inside these "
                    "speed figures; a shape the warm-up did not reach was compiled while timed (re-run, or report it "
                    "as an engine bug)"),
    }]
