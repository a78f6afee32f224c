"""The change detector, the status table and the HTML / Markdown / JSON reports on a history with known
injected regressions (tests/_history_fixtures.py): each output flags exactly those and nothing else."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest

from specbench.gating.baselines import BaselineStore
from specbench.gating.gates import HIGHER_IS_BETTER, LOWER_IS_BETTER
from specbench.report.changes import detect_regressions, find_steps
from specbench.report.cli import main
from specbench.gating.history import load_history
from specbench.report.html import TREND_METRICS
from specbench.report.status import status_rows
from tests._history_fixtures import (
    ACCEPTANCE_CASE,
    CASES,
    GPU,
    HARDWARE_CLASSES,
    SPEED_CASE,
    STEADY_CASE,
    build_history,
    expected_regressions,
    latest,
)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    results = build_history(root / "history", root / "baselines")
    return root, results


@pytest.fixture(scope="module")
def history(built):
    return load_history(built[0] / "history")


# ---- the step detector on hand-made series -----------------------------------------------------------


def steps(values, direction=HIGHER_IS_BETTER, tolerance=0.05, boundaries=None):
    boundaries = range(1, len(values)) if boundaries is None else boundaries
    return [s["index"] for s in find_steps(values, boundaries, direction=direction, tolerance=tolerance)]


def test_a_clean_step_is_found_at_its_first_run_not_its_neighbours():
    assert steps([1.0] * 8 + [0.8] * 6) == [8]  # the neighbours' windows pass the median rule too
    assert steps([1.0] * 8 + [0.8] * 6, boundaries=[2, 4, 6, 8, 10, 12]) == [8]


def test_improvements_small_changes_and_single_outliers_are_not_flagged():
    assert steps([1.0] * 8 + [1.3] * 6) == []  # higher is better: an improvement
    assert steps([1.0] * 8 + [0.97] * 6) == []  # 3% < 5% tolerance
    assert steps([1.0] * 8 + [0.5] + [1.0] * 6) == []  # one bad run: the after-window's median ignores it


def test_latency_rises_are_regressions():
    assert steps([0.010] * 8 + [0.013] * 6, direction=LOWER_IS_BETTER, tolerance=0.15) == [8]
    assert steps([0.010] * 8 + [0.007] * 6, direction=LOWER_IS_BETTER, tolerance=0.15) == []


def test_a_step_needs_three_runs_after_it_and_must_beat_the_noise():
    assert steps([1.0] * 8 + [0.8] * 2) == []  # two runs could be one bad day; nor is boundary 7 flagged instead
    assert steps([1.0] * 8 + [0.8] * 3) == [8]
    assert steps([1.0] * 10 + [0.93] * 10) == [10]  # 7% > 5% tolerance, no noise
    wobble = [1.10, 0.90, 1.12, 0.88, 1.00]  # sigma ~ 0.15 (1.4826 x MAD 0.1): a 7% step hides in it
    assert steps(wobble * 2 + [v * 0.93 for v in wobble] * 2) == []


def test_two_steps_are_two_regressions():
    assert steps([1.0] * 6 + [0.8] * 6 + [0.6] * 6) == [6, 12]


# ---- the synthetic history -----------------------------------------------------------------------------


def test_detector_flags_exactly_the_injected_regressions(history):
    found = detect_regressions(history)
    assert {r.key() for r in found} == expected_regressions()
    drop = next(r for r in found if r.key()[:3] == (ACCEPTANCE_CASE, "acceptance_rate", "cpu"))
    # the fixture multiplies acceptance by 0.8; medians of 5 noisy runs (1% sd) land within 3% of that
    assert drop.relative_change == pytest.approx(-0.2, abs=0.03)
    assert drop.before == pytest.approx(0.60, rel=0.03) and drop.num_before == drop.num_after == 5


def test_detector_uses_per_case_tolerance_overrides(history):
    # with a 25% tolerance on acceptance the 20% drop no longer counts; MAL (-12.9%) still does
    found = detect_regressions(history, baseline_tolerances={ACCEPTANCE_CASE: {"acceptance_rate": 0.25}})
    assert {r.key() for r in found} == {k for k in expected_regressions() if k[1] != "acceptance_rate"}


def test_status_table_gates_the_latest_run_against_the_baselines(built, history):
    root, results = built
    rows = {(r.case_id, r.hardware_class): r for r in status_rows(history, BaselineStore(root / "baselines"))}
    assert set(rows) == {(c, hw) for c in CASES for hw in HARDWARE_CLASSES}
    for hw in HARDWARE_CLASSES:
        accept = rows[ACCEPTANCE_CASE, hw]
        assert accept.status == "regression" and accept.metrics["acceptance_rate"].status == "regression"
        assert accept.metrics["acceptance_rate"].measured == pytest.approx(
            latest(results, ACCEPTANCE_CASE, hw)["metrics"]["acceptance_rate"])
        assert accept.metrics["acceptance_rate"].baseline == pytest.approx(0.60)
        assert rows[STEADY_CASE, hw].status == "improvement"  # +10% acceptance: never a failure
    assert rows[SPEED_CASE, GPU].status == rows[SPEED_CASE, GPU].metrics["tokens_per_s"].status == "regression"
    assert rows[SPEED_CASE, "cpu"].status == "pass"
    assert rows[ACCEPTANCE_CASE, "cpu"].per_position_baseline == pytest.approx([0.78, 0.60, 0.42])  # 0.6 x weights


class _Tables(HTMLParser):
    """Collects data-* attributes of the regression and status rows, and counts charts and outside links."""

    def __init__(self):
        super().__init__()
        self.regressions, self.status, self.svgs, self.external, self.scripts = [], [], 0, [], 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "tr" and a.get("class") == "regression":
            self.regressions.append((a["data-case"], a["data-metric"], a["data-hardware-class"], a["data-commit"]))
        if tag == "tr" and a.get("class") == "status-row":
            self.status.append((a["data-case"], a["data-hardware-class"], a["data-status"]))
        self.svgs += tag == "svg"
        self.scripts += tag == "script"
        self.external += [v for k, v in attrs if k in ("src", "href") and v and re.match(r"[a-z]+:", v)]


def test_html_report_flags_exactly_the_injected_regressions(built, capsys):
    root, _ = built
    out = root / "html"
    assert main(["report", "--history", str(root / "history"), "--baselines", str(root / "baselines"),
                 "--out", str(out)]) == 0
    assert "7 flagged regressions" in capsys.readouterr().out  # the fixture injects 7 (case, metric, class)
    page = (out / "index.html").read_text()
    tables = _Tables()
    tables.feed(page)
    assert len(tables.regressions) == len(set(tables.regressions))
    assert set(tables.regressions) == expected_regressions()
    statuses = {(case, hw): s for case, hw, s in tables.status}
    assert statuses[ACCEPTANCE_CASE, "cpu"] == statuses[SPEED_CASE, GPU] == "regression"
    assert statuses[SPEED_CASE, "cpu"] == "pass"
    # per case: acceptance, MAL, speedup, tokens/s on each class, per-position
    assert tables.svgs == len(CASES) * (3 + len(HARDWARE_CLASSES) + 1)
    assert tables.scripts == 0 and tables.external == []  # works from file://, fetches nothing
    assert page.count("<td class=\"text\">570.86.15</td>") == 78  # the GPU driver of each of the 156 / 2 GPU runs
    plotted = [k for k in expected_regressions() if k[1] in TREND_METRICS]  # s/token is flagged, not plotted
    assert page.count('class="regression-marker"') == len(plotted)


def test_markdown_summary_flags_exactly_the_injected_regressions(built, capsys):
    root, _ = built
    assert main(["report", "--history", str(root / "history"), "--baselines", str(root / "baselines"),
                 "--format", "markdown"]) == 0
    text = capsys.readouterr().out
    section = text.split("### Regressions flagged over the history")[1].split("###")[0]
    rows = [[c.strip().strip("`") for c in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| case")]
    assert {(r[0], r[1], r[2], r[3]) for r in rows} == expected_regressions() and len(rows) == 7
    status = text.split("### Latest run per case vs baseline")[1]
    assert re.search(rf"\| {re.escape(SPEED_CASE)} \| {GPU} \|.*\*\*regression\*\* \|", status)
    assert re.search(rf"\| {re.escape(SPEED_CASE)} \| cpu \|.* pass \|", status)


def test_json_report_lists_the_regressions_with_before_after_and_change(built):
    root, _ = built
    assert main(["report", "--history", str(root / "history"), "--baselines", str(root / "baselines"),
                 "--format", "json", "--out", str(root / "json")]) == 0
    payload = json.loads((root / "json" / "report.json").read_text())
    keys = {(r["case"], r["metric"], r["hardware_class"], r["commit"]) for r in payload["regressions"]}
    assert keys == expected_regressions()
    for r in payload["regressions"]:
        assert r["relative_change"] == pytest.approx(r["after"] / r["before"] - 1)
    assert payload["num_runs"] == 156  # 24 commits + 2 reruns, x 3 cases x 2 hardware classes


def test_report_bad_input_exits_2(tmp_path, capsys):
    assert main(["report", "--history", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["report", "--history", str(tmp_path), "--baselines", str(tmp_path / "none")]) == 2
    assert "baseline directory" in capsys.readouterr().err
