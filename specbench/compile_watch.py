"""What a timed window should never contain, counted so that it is flagged, not trusted: torch.compile's compilations
and CUDA-graph captures (their seconds would be inside the speed figures)."""

from __future__ import annotations

from contextlib import contextmanager

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


def capture_flags(seconds: float, where: str) -> list[dict]:
    """The measurement flag of ``seconds`` of graph capture by the target or the proposer (and the compiling and tuning
    it includes) that happened inside timed ``where`` (empty when none): a shape the warm-up did not reach."""
    if not seconds > 0:
        return []
    return [{
        "kind": "captured_while_timed",
        "message": (f"the target or the proposer captured CUDA graphs for {seconds:.2f} s during the {where}: capture time is inside "
                    "these speed figures; a step or prefill shape the warm-up did not reach (report it as an engine bug)"),
    }]


def capture_seconds(*owners) -> float:
    """Graph-capture seconds so far of ``owners`` (a target, a proposer: whatever has ``capture_seconds``)."""
    return sum(float(getattr(owner, "capture_seconds", 0.0) or 0.0) for owner in owners if owner is not None)


class TimedWindow:
    """Compilations and the ``owners``' capture seconds summed over the timed calls run under :meth:`timed` only (a
    run's untimed step-cost measurement between them is left out)."""

    def __init__(self, *owners):
        self.owners, self.compiled, self.captured = owners, 0, 0.0

    @contextmanager
    def timed(self):
        compiled, captured = compiled_graphs(), capture_seconds(*self.owners)
        try:
            yield
        finally:
            self.compiled += compiled_graphs() - compiled
            self.captured += capture_seconds(*self.owners) - captured

    def flags(self, where: str = "timed runs") -> list[dict]:
        return compile_flags(self.compiled, where) + capture_flags(self.captured, where)
