"""The results history (records, concurrent appends, truncated lines) and `specbench check` exit codes."""

from __future__ import annotations

import json
import multiprocessing
import re
import threading

import pytest

from specbench.gating.regenerate import update_baseline
from specbench.gating.baselines import compare
from specbench.report.arguments import main
from specbench.gating.history import (
    HistoryError,
    TruncatedRecordWarning,
    append_results,
    load_history,
    writer_file_name,
)
from tests._history_fixtures import GPU, START, commit, synthetic_result, write_records
from tests._synthetic_results import make_result

WRITERS, RECORDS_PER_WRITER = 8, 50


def test_record_round_trip_keeps_metrics_env_commit_and_gate(tmp_path):
    baselines = tmp_path / "baselines"
    update_baseline(make_result(seed=0), baselines, command="test", reason="test")
    good, bad = make_result(seed=1), make_result(seed=2, accept_scale=0.6)
    bad["env"] = {**bad["env"], "hardware_class": GPU, "git_commit": "feedbeef"}
    reports = [compare(good, baselines), compare(bad, baselines)]
    path = append_results(tmp_path / "history", [good, bad], gate_reports=reports)
    assert path.name == writer_file_name() and path.name.startswith("records-")

    history = load_history(tmp_path / "history")
    assert len(history) == 2
    first, second = history.iloc[0], history.iloc[1]
    assert (first["case_id"], first["suite"], first["case"]) == ("medusa/medusa-chain-k3", "medusa", "medusa-chain-k3")
    assert first["acceptance_rate"] == pytest.approx(good["metrics"]["acceptance_rate"])
    assert first["per_position_acceptance_rate"] == pytest.approx(good["metrics"]["per_position_acceptance_rate"])
    assert len(first["per_position_acceptance_rate"]) == 3  # K = 3 positions, kept as one list cell
    assert first["tokens_per_s"] == pytest.approx(good["metrics"]["tokens_per_s"])
    assert (first["hardware_class"], first["git_commit"]) == ("cpu", "0123abc")
    assert (second["hardware_class"], second["git_commit"]) == (GPU, "feedbeef")
    assert first["gate_passed"] is True and second["gate_passed"] is False
    assert any("acceptance_rate" in f for f in second["gate_failures"])
    assert str(first["created_at"]) == "2026-11-30 10:00:00+00:00"
    assert len(first["requests"]) == 40 and set(first["requests"][0]) >= {"num_accepted_tokens", "tokens_per_s"}


def test_gate_reports_must_match_results(tmp_path):
    with pytest.raises(HistoryError, match="2 results but 1 gate reports"):
        append_results(tmp_path, [make_result(0), make_result(1)], gate_reports=[None])


def test_eight_concurrent_processes_lose_no_record(tmp_path):
    context = multiprocessing.get_context("spawn")  # fresh interpreters: nothing shared but the directory
    start = context.Event()
    writers = [context.Process(target=write_records, args=(str(tmp_path), w, RECORDS_PER_WRITER, start))
               for w in range(WRITERS)]
    for p in writers:
        p.start()
    start.set()
    for p in writers:
        p.join(timeout=120)
    assert [p.exitcode for p in writers] == [0] * WRITERS

    history = load_history(tmp_path)  # raises on any interleaved (unparseable) line
    assert len(history) == WRITERS * RECORDS_PER_WRITER
    seen = set(zip(history["case_id"], history["num_requests"].astype(int)))
    assert seen == {(f"conc/w{w}", i) for w in range(WRITERS) for i in range(RECORDS_PER_WRITER)}
    assert len(list(tmp_path.glob("records-*.jsonl"))) == WRITERS  # one file per writer process


def test_threads_sharing_one_file_lose_no_record(tmp_path):
    threads = [threading.Thread(target=write_records, args=(str(tmp_path), w, 25)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(list(tmp_path.glob("*.jsonl"))) == 1  # one process, one file: the flock serialises the threads
    history = load_history(tmp_path)
    assert len(set(zip(history["case_id"], history["num_requests"]))) == 100


def _two_records(directory):
    runs = [synthetic_result("demo/a", "cpu", commit(i), START, acceptance=0.5, tokens_per_s=10.0,
                             plain_tokens_per_s=8.0, ttft=0.1) for i in range(2)]
    return append_results(directory, runs)


def test_truncated_last_line_is_skipped_with_a_warning(tmp_path):
    path = _two_records(tmp_path)
    complete = path.read_text()
    path.write_text(complete + complete.splitlines()[0][:57])  # a writer killed 57 bytes into its line
    with pytest.warns(TruncatedRecordWarning, match=rf"{path.name}:3: skipped a truncated last line"):
        history = load_history(tmp_path)
    assert len(history) == 2


def test_corrupt_line_inside_a_file_is_an_error(tmp_path):
    path = _two_records(tmp_path)
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "{not json", lines[1]]) + "\n")
    with pytest.raises(HistoryError, match=rf"{path.name}:2: not a JSON record"):
        load_history(tmp_path)


def test_missing_history_directory_is_a_clear_error(tmp_path):
    with pytest.raises(HistoryError, match="does not exist"):
        load_history(tmp_path / "nope")


# ---- specbench check ---------------------------------------------------------------------------------


@pytest.fixture()
def baselines(tmp_path):
    update_baseline(make_result(seed=0), tmp_path / "baselines", command="test", reason="test")
    return tmp_path / "baselines"


def _jsonl(path, results):
    path.write_text("".join(json.dumps(r) + "\n" for r in results))
    return str(path)


def test_check_passes_on_noise(tmp_path, baselines, capsys):
    results = _jsonl(tmp_path / "r.jsonl", [make_result(seed=1), make_result(seed=2)])
    assert main(["check", "--results", results, "--baselines", str(baselines)]) == 0
    out = capsys.readouterr().out
    assert "medusa/medusa-chain-k3: PASSED" in out and "all 2 cases pass" in out


def test_check_fails_naming_case_metric_baseline_measured_tolerance(tmp_path, baselines, capsys):
    drop = make_result(seed=1, accept_scale=0.6)  # a real 40% acceptance drop
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"results": [make_result(seed=2), drop]}))  # `specbench run --output` layout
    assert main(["check", "--results", str(path), "--baselines", str(baselines)]) == 1
    out = capsys.readouterr().out
    baseline, measured = make_result(seed=0)["metrics"]["acceptance_rate"], drop["metrics"]["acceptance_rate"]
    assert (f"medusa/medusa-chain-k3: acceptance_rate regression: baseline {baseline:.4g}, measured {measured:.4g}, "
            "tolerance 5%") in out
    assert "failing checks in 1 of 2 cases" in out


def test_check_records_gated_runs_in_the_history_and_gates_it_later(tmp_path, baselines, capsys):
    results = _jsonl(tmp_path / "r.jsonl", [make_result(seed=1, accept_scale=0.6)])
    history = tmp_path / "history"
    assert main(["check", "--results", results, "--history", str(history), "--baselines", str(baselines)]) == 1
    stored = load_history(history)
    assert len(stored) == 1 and stored.iloc[0]["gate_passed"] is False
    capsys.readouterr()
    # the stored compact requests give the same verdict without the results file
    assert main(["check", "--history", str(history), "--baselines", str(baselines)]) == 1
    assert "acceptance_rate regression" in capsys.readouterr().out


@pytest.mark.parametrize("content, message", [
    (None, "cannot read the results file"),
    ('{"case_id": "medusa/x", "metrics": {}}\n{"case_id": "medu', r"r.jsonl:2: not valid JSON"),
    ('{"case_id": "medusa/x"}\n', r"r.jsonl:1: run result lacks \['metrics'\]"),
    ("[1, 2]\n", "expected a run result object, found list"),
])
def test_check_bad_input_exits_2_with_the_reason(tmp_path, baselines, capsys, content, message):
    path = tmp_path / "r.jsonl"
    if content is not None:
        path.write_text(content)
    assert main(["check", "--results", str(path), "--baselines", str(baselines)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specbench check: error:")
    assert re.search(message, err), err


def test_check_without_input_or_with_a_broken_baseline_exits_2(tmp_path, baselines, capsys):
    assert main(["check", "--baselines", str(baselines)]) == 2
    assert "give --results FILE... and/or --history DIR" in capsys.readouterr().err
    (baselines / "medusa.json").write_text("{broken")
    results = _jsonl(tmp_path / "r.jsonl", [make_result(seed=1)])
    assert main(["check", "--results", results, "--baselines", str(baselines)]) == 2
    assert "medusa.json: not valid JSON" in capsys.readouterr().err
