"""torch.compile inside timed windows: counted and flagged on a case's result (specbench/compile_watch.py)."""

from __future__ import annotations

import itertools

import pytest

from specbench import compile_watch
from specbench.cases import Case
from specbench.compile_watch import TimedWindow, capture_flags, capture_seconds, compile_flags
from specbench.run.harness import run_case

NGRAM = dict(name="watch", proposer={"name": "ngram", "num_speculative_tokens": 3}, max_new_tokens=8,
             prompts={"name": "synthetic", "num_prompts": 3})


def test_compile_flags_name_the_count_and_the_window():
    assert compile_flags(0, "timed runs") == []
    (flag,) = compile_flags(2, "timed runs")
    assert flag["kind"] == "compiled_while_timed"
    assert "compiled 2 graph(s) during the timed runs" in flag["message"]


@pytest.mark.parametrize("batch_size, windows", [(None, 3), (2, 2)])  # per request; per plain and speculative run
def test_a_run_that_compiled_while_timed_is_flagged_and_an_eager_one_is_not(monkeypatch, batch_size, windows):
    case = dict(NGRAM, **({} if batch_size is None else {"batch_size": batch_size, "engine": "static"}))
    clean = run_case(Case.from_dict(case), progress=False).to_dict()  # the CPU engine compiles nothing
    assert not [f for f in clean["flags"] if f["kind"] == "compiled_while_timed"]
    assert clean["details"]["engine"]["proposer_capture_seconds"] == 0.0  # n-gram captures nothing, on any device
    counts = itertools.count()  # one more graph at every read: each timed window compiled one
    monkeypatch.setattr(compile_watch, "compiled_graphs", lambda: next(counts))
    flagged = run_case(Case.from_dict(case), progress=False).to_dict()
    assert [f["message"] for f in flagged["flags"] if f["kind"] == "compiled_while_timed"] == [
        compile_flags(windows, "timed runs")[0]["message"]]  # the step costs between runs are not in the window
    assert [r["output_token_ids"] for r in flagged["requests"]] == [r["output_token_ids"] for r in clean["requests"]]


def test_a_timed_window_sums_only_what_it_wraps():
    class Owner:
        capture_seconds = 0.0

    owner = Owner()
    window = TimedWindow(owner, None)
    with window.timed():
        owner.capture_seconds += 0.5
    owner.capture_seconds += 9.0  # between timed calls (step costs, warm-up): not counted
    with window.timed():
        owner.capture_seconds += 0.25
    assert window.captured == 0.75 and window.compiled == 0
    assert [f["kind"] for f in window.flags()] == ["captured_while_timed"]
    assert capture_seconds(owner, object(), None) == 9.75


def test_capture_flags_and_a_run_whose_target_captured_while_timed(monkeypatch):
    from specbench.engine.static_target import StaticTarget

    assert capture_flags(0.0, "timed runs") == []
    (flag,) = capture_flags(1.5, "timed runs")
    assert flag["kind"] == "captured_while_timed" and "for 1.50 s during the timed runs" in flag["message"]
    case = dict(NGRAM, engine="static")
    clean = run_case(Case.from_dict(case), progress=False).to_dict()  # the CPU static engine captures nothing
    assert not [f for f in clean["flags"] if f["kind"] == "captured_while_timed"]
    seconds = itertools.count(0.0, 0.75)  # each read of capture_seconds later than the last: captures while timed
    monkeypatch.setattr(StaticTarget, "capture_seconds", property(lambda self: next(seconds)))
    flagged = run_case(Case.from_dict(case), progress=False).to_dict()
    assert [f["kind"] for f in flagged["flags"] if f["kind"] == "captured_while_timed"] == ["captured_while_timed"]
