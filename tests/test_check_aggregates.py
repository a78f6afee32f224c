"""`specbench check` refuses a result whose aggregates contradict its own per-request counters (exit 2, naming
the metric, the file, the stored and the recomputed values): such a file was edited or damaged, not measured."""

from __future__ import annotations

import json

import pytest

from specbench.gating.aggregates import contradictions, recomputed
from specbench.gating.regenerate import update_baseline
from specbench.report.arguments import main
from tests._synthetic_results import make_result


@pytest.fixture()
def baselines(tmp_path):
    update_baseline(make_result(seed=0), tmp_path / "baselines", command="test", reason="test")
    return tmp_path / "baselines"


def test_a_measured_result_agrees_with_its_requests():
    result = make_result(seed=1, num_repeats=3)  # repeats repeat the requests; the first repeat's are pooled
    assert recomputed(result)["acceptance_rate"] == result["metrics"]["acceptance_rate"]
    assert contradictions(result) == []


def test_an_edited_acceptance_rate_is_bad_input(tmp_path, baselines, capsys):
    result = make_result(seed=1)
    measured = result["metrics"]["acceptance_rate"]
    result["metrics"]["acceptance_rate"] = 0.150  # the reported edit: counters unchanged
    path = tmp_path / "r.json"
    path.write_text(json.dumps(result))
    assert main(["check", "--results", str(path), "--baselines", str(baselines)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"specbench check: error: {path}: metrics.acceptance_rate is 0.15 but its requests' "
                          f"counters give {measured:.6g}")


def test_an_edited_per_position_rate_and_mal_are_named(tmp_path, baselines, capsys):
    result = make_result(seed=1)
    result["metrics"]["mean_acceptance_length"] += 0.5
    result["metrics"]["per_position_acceptance_rate"][0] = 0.99
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(make_result(seed=2)) + "\n" + json.dumps(result) + "\n")
    assert main(["check", "--results", str(path), "--baselines", str(baselines)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:2: metrics.mean_acceptance_length is" in err and "(also per_position_acceptance_rate)" in err


def test_a_result_without_per_request_counters_is_not_second_guessed():
    result = make_result(seed=1)
    for request in result["requests"]:
        del request["accepted_per_position"]
    result["metrics"]["acceptance_rate"] = 0.150
    assert recomputed(result) is None and contradictions(result) == []
