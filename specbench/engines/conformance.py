"""The conformance verdict: an engine under test against specbench's reference engine on the same case, request by
request. Greedy outputs must be identical; the counters too, unless a known divergence says the two implement
different rules there. Each difference names the request, the counter, both values and the first diverging
token (docs/conformance.md#verdict)."""

from __future__ import annotations

from specbench.engines.interface import EngineRun
from specbench.metrics import common_prefix

COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_position")
SHOWN = 5  # differences spelled out in the verdict's reason; all of them are in the result


def _padded(a: list[int], b: list[int]) -> tuple[list[int], list[int]]:
    """Two per-position lists at one length (a position never reached counts 0 on either side)."""
    width = max(len(a), len(b))
    return a + [0] * (width - len(a)), b + [0] * (width - len(b))


def _first_divergence(ours: list[int], theirs: list[int]) -> dict | None:
    """Where two outputs part: the position and each side's token there (None: identical)."""
    if ours == theirs:
        return None
    at = common_prefix(ours, theirs)
    token = lambda ids: ids[at] if at < len(ids) else None  # noqa: E731 - None: that output ended there
    return {"position": at, "engine": token(ours), "reference": token(theirs)}


def request_differences(index: int, prompt_id: str, engine: dict, reference: dict, counters: bool) -> list[dict]:
    """What differs in one request: its outputs, and (when ``counters``) each counter."""
    divergence = _first_divergence(engine["output_token_ids"], reference["output_token_ids"])
    found = []
    if divergence is not None:
        found.append({"request": prompt_id, "index": index, "what": "output_token_ids",
                      "engine": len(engine["output_token_ids"]), "reference": len(reference["output_token_ids"]),
                      "first_divergence": divergence})
    for name in COUNTERS if counters else ():
        ours, theirs = engine.get(name) or (0 if name != "accepted_per_position" else []), reference.get(name)
        if name == "accepted_per_position":
            ours, theirs = _padded(list(ours), list(theirs or []))
        if ours != theirs:
            found.append({"request": prompt_id, "index": index, "what": name, "engine": ours, "reference": theirs,
                          "first_divergence": divergence})
    return found


def describe(difference: dict, engine: str) -> str:
    """One difference in words: request, counter, both values, first diverging token."""
    where = difference["first_divergence"]
    token = ("outputs identical" if where is None else
             f"outputs first diverge at token {where['position']} ({engine} {where['engine']}, specbench "
             f"{where['reference']})")
    what = "output length" if difference["what"] == "output_token_ids" else difference["what"]
    return (f"request {difference['request']!r} (#{difference['index']}): {what} {engine} {difference['engine']} vs "
            f"specbench {difference['reference']}; {token}")


def verdict(run: EngineRun, requests: list[dict], reference: dict, *, greedy: bool) -> dict:
    """The conformance section of an engine's result: ``requests`` are its request records, ``reference`` the
    reference engine's result dict for the same case."""
    divergences = run.translation.divergences
    counters = not divergences  # every known divergence so far changes what is drafted, never the outputs
    differences = []
    if greedy:
        for index, (ours, theirs) in enumerate(zip(requests, reference["requests"])):
            differences += request_differences(index, ours["prompt_id"], ours, theirs, counters)
    exact = greedy and not differences
    reason = ("sampled: the two engines draw different random numbers, so nothing is compared" if not greedy else
              f"every request's outputs{' and counters' if counters else ''} identical" if exact else
              f"{len({d['index'] for d in differences})} of {len(requests)} requests differ: "
              + "; ".join(describe(d, run.engine) for d in differences[:SHOWN]))
    if divergences and greedy:
        reason += "; counters not compared, known divergence: " + "; ".join(d.what for d in divergences)
    totals = {name: reference["metrics"].get(name) for name in ("num_drafts", "num_draft_tokens",
                                                                  "num_accepted_tokens", "acceptance_rate")}
    return {"engine": run.engine, "reference_engine": reference["case"]["engine"], "checked": greedy,
            "exact": exact, "counters_compared": counters and greedy,
            "known_divergences": [d.to_dict() for d in divergences], "differences": differences,
            "reason": reason, "reference_metrics": totals}
