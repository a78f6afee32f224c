"""Summaries a CI job reads must not mislead: speed that was not gated says so in the Markdown, an empty history
is a line rather than 0 bytes, no line names a baseline file that does not exist, `check` is brief unless -v,
and text from case files and environments is escaped in the Markdown."""

from __future__ import annotations

import json

import pytest

from specbench.gating.baselines import BaselineStore, compare
from specbench.gating.history import append_results
from specbench.gating.regenerate import update_baseline
from specbench.report.arguments import main
from tests._synthetic_results import make_result

HOSTILE = "<img src=x onerror=alert(2)>"


@pytest.fixture()
def recorded(tmp_path):
    """A baseline and one later run of a case whose CPU speed is not gated (gate_speed unset), 70% slower."""
    baselines, history = tmp_path / "baselines", tmp_path / "history"
    update_baseline(make_result(seed=0, gate_speed=None), baselines, command="test", reason="test")
    slow = make_result(seed=1, gate_speed=None, speed_scale=0.3)
    append_results(history, [slow], gate_reports=[compare(slow, BaselineStore(baselines))])
    return baselines, history


def test_markdown_says_which_measured_speed_was_not_gated(recorded, capsys):
    baselines, history = recorded
    assert main(["report", "--format", "markdown", "--history", str(history), "--baselines", str(baselines)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| medusa/"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    acceptance, tokens_per_s, gate = cells[3], cells[5], cells[-1]
    assert gate == "pass"
    assert tokens_per_s.endswith("(-69.9%) (not gated)")  # the 70% slowdown, marked as not gated
    assert "not gated" not in acceptance  # quality was gated: its pass covers it


def test_an_empty_history_is_a_line_of_markdown_not_nothing(tmp_path, capsys):
    (tmp_path / "history").mkdir()
    assert main(["report", "--format", "markdown", "--history", str(tmp_path / "history"), "--out", str(tmp_path)]) == 0
    summary = (tmp_path / "summary.md").read_text()
    assert "No runs recorded" in summary and str(tmp_path / "history") in summary


def test_no_line_names_a_baseline_file_that_does_not_exist(tmp_path, recorded, capsys):
    baselines, _ = recorded
    result = make_result(seed=1, suite="cli", name="ngram")  # an explicit run: cli.json was never written
    report = compare(result, BaselineStore(baselines))
    assert not (baselines / "cli.json").exists()
    assert "cli.json" not in report.headline()
    stored = compare(make_result(seed=1, gate_speed=None), BaselineStore(baselines))
    assert stored.headline().endswith(f"against {baselines / 'medusa.json'}")  # the file it was gated against


def test_check_is_a_line_per_case_unless_verbose(tmp_path, recorded, capsys):
    baselines, _ = recorded
    path = tmp_path / "r.json"
    path.write_text(json.dumps(make_result(seed=2, gate_speed=None)))
    assert main(["check", "--results", str(path), "--baselines", str(baselines)]) == 0
    brief = capsys.readouterr().out.strip().splitlines()
    # headline, its source, the skipped-speed summary, a blank line, the verdict
    assert len(brief) == 5 and brief[0].startswith("medusa/medusa-chain-k3: PASSED")
    assert main(["check", "--results", str(path), "--baselines", str(baselines), "-v"]) == 0
    verbose = capsys.readouterr().out
    assert verbose.count("\n") > len(brief) + 10 and "tokens_per_s" in verbose  # every check, one per line


def test_markdown_escapes_names_and_environments(tmp_path, capsys):
    baselines, history = tmp_path / "baselines", tmp_path / "history"
    update_baseline(make_result(seed=0, name=HOSTILE, hardware_class=HOSTILE), baselines, command="t", reason="t")
    worse = make_result(seed=1, name=HOSTILE, hardware_class=HOSTILE, accept_scale=0.6)  # a failing check, too
    append_results(history, [worse], gate_reports=[compare(worse, BaselineStore(baselines))])
    assert main(["report", "--format", "markdown", "--history", str(history), "--baselines", str(baselines)]) == 0
    out = capsys.readouterr().out
    assert "<img" not in out
    assert out.count("&lt;img src=x onerror=alert(2)>") >= 3  # case, hardware class, the failing check's line
