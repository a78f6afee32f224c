"""The change detector, the status table and the HTML / Markdown / JSON reports on a synthetic history.

The history has known injected regressions (tests/_history_fixtures.py): each output flags exactly those and
nothing else; every expected count is derived from the fixture's records. Untrusted text (case names,
commits, hardware classes, metric labels) is escaped in every output, and counts are pluralised.
"""

from __future__ import annotations

import ast
import json
import re
from datetime import timedelta
from html.parser import HTMLParser
from pathlib import Path

import jinja2
import pytest

import specbench.report
from specbench.gating.baselines import BaselineStore
from specbench.gating.gates import DEFAULT_TOLERANCES, HIGHER_IS_BETTER, LOWER_IS_BETTER
from specbench.gating.history import append_results, load_history
from specbench.report.changes import WINDOW, Regression, detect_regressions, find_steps
from specbench.report.arguments import main
from specbench.report.html import MAX_ENV_ROWS, SPLIT_METRICS, TREND_METRICS, render_html, template_environment
from specbench.report.html import write_html_report
from specbench.report.markdown import render_markdown
from specbench.report.status import METRIC_LABELS, plural, status_rows
from tests._history_fixtures import (
    ACCEPTANCE_CASE,
    ACCEPTANCE_DROP_AT,
    ACCEPTANCE_FACTOR,
    GPU,
    GPU_DRIVER,
    K,
    LEVELS,
    POSITION_WEIGHTS,
    SPEED_CASE,
    START,
    STEADY_CASE,
    build_history,
    commit,
    expected_regressions,
    latest,
    synthetic_result,
)

REPORT_DIR = Path(specbench.report.__file__).parent


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    results = build_history(root / "history", root / "baselines")
    return root, results


@pytest.fixture(scope="module")
def history(built):
    return load_history(built[0] / "history")


@pytest.fixture(scope="module")
def records(built):
    """What the fixture's records hold, counted from the records themselves (not from its constants)."""
    results = built[1]
    classes = sorted({r["env"]["hardware_class"] for r in results})
    cases = sorted({r["case_id"] for r in results})
    return {"results": results, "classes": classes, "cases": cases,
            "commits": sorted({r["env"]["git_commit"] for r in results}),
            "pairs": {(r["case_id"], r["env"]["hardware_class"]) for r in results},
            "gpu_runs": sum(r["env"]["driver_version"] == GPU_DRIVER for r in results)}


def runs_of(results, case_id, hardware_class):
    return [r for r in results if r["case_id"] == case_id and r["env"]["hardware_class"] == hardware_class]


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


def test_detector_flags_exactly_the_injected_regressions(history, records):
    found = detect_regressions(history)
    assert expected_regressions() and {r.key() for r in found} == expected_regressions()
    drop = next(r for r in found if r.key()[:3] == (ACCEPTANCE_CASE, "acceptance_rate", "cpu"))
    # the fixture multiplies acceptance by ACCEPTANCE_FACTOR; medians of noisy runs (1% sd) land within 3% of it
    assert drop.relative_change == pytest.approx(ACCEPTANCE_FACTOR - 1, abs=0.03)
    assert drop.before == pytest.approx(LEVELS[ACCEPTANCE_CASE]["cpu"][0], rel=0.03)
    series = [r["env"]["git_commit"] for r in runs_of(records["results"], ACCEPTANCE_CASE, "cpu")]
    first_after = series.index(commit(ACCEPTANCE_DROP_AT))
    assert (drop.num_before, drop.num_after) == (min(WINDOW, first_after), min(WINDOW, len(series) - first_after))


def test_detector_uses_per_case_tolerance_overrides(history):
    # a tolerance just past the acceptance drop hides it; MAL (1 + K x rate) falls by less but still by more than
    # its default tolerance, so it is still flagged
    acceptance = LEVELS[ACCEPTANCE_CASE]["cpu"][0]
    drop = 1 - ACCEPTANCE_FACTOR
    mal_drop = 1 - (1 + K * acceptance * ACCEPTANCE_FACTOR) / (1 + K * acceptance)
    assert mal_drop > 2 * DEFAULT_TOLERANCES["mean_acceptance_length"]  # the fixture leaves MAL a clear step
    found = detect_regressions(history, baseline_tolerances={ACCEPTANCE_CASE: {"acceptance_rate": drop + 0.05}})
    assert {r.key() for r in found} == {k for k in expected_regressions() if k[1] != "acceptance_rate"}


def test_status_table_gates_the_latest_run_against_the_baselines(built, history, records):
    root, results = built
    rows = {(r.case_id, r.hardware_class): r for r in status_rows(history, BaselineStore(root / "baselines"))}
    assert set(rows) == records["pairs"] and len(rows) == len(records["cases"]) * len(records["classes"])
    for hw in records["classes"]:
        accept = rows[ACCEPTANCE_CASE, hw]
        assert accept.status == "regression" and accept.metrics["acceptance_rate"].status == "regression"
        assert accept.metrics["acceptance_rate"].measured == pytest.approx(
            latest(results, ACCEPTANCE_CASE, hw)["metrics"]["acceptance_rate"])
        assert accept.metrics["acceptance_rate"].baseline == pytest.approx(LEVELS[ACCEPTANCE_CASE][hw][0])
        assert rows[STEADY_CASE, hw].status == "improvement"  # +10% acceptance: never a failure
    assert rows[SPEED_CASE, GPU].status == rows[SPEED_CASE, GPU].metrics["tokens_per_s"].status == "regression"
    assert rows[SPEED_CASE, "cpu"].status == "pass"
    level = LEVELS[ACCEPTANCE_CASE]["cpu"][0]
    assert rows[ACCEPTANCE_CASE, "cpu"].per_position_baseline == pytest.approx([level * w for w in POSITION_WEIGHTS])


class _Tables(HTMLParser):
    """Collects data-* attributes of the regression and status rows, the text of every element, the rows of
    the environment table, and counts charts, scripts and outside links."""

    def __init__(self):
        super().__init__()
        self.regressions, self.status, self.svgs, self.external, self.scripts = [], [], 0, [], 0
        self.attributes, self.texts, self.env_rows, self.tags, self._table = [], {}, 0, [], None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        self.attributes += [v for _, v in attrs if v]
        if tag == "tr" and a.get("class") == "regression":
            self.regressions.append((a["data-case"], a["data-metric"], a["data-hardware-class"], a["data-commit"]))
        if tag == "tr" and a.get("class") == "status-row":
            self.status.append((a["data-case"], a["data-hardware-class"], a["data-status"]))
        if tag == "table":
            self._table = a.get("id")
        self.env_rows += tag == "tr" and self._table == "environment-table"
        self.svgs += tag == "svg"
        self.scripts += tag == "script"
        self.external += [v for k, v in attrs if k in ("src", "href", "xlink:href", "action") and v]

    def handle_endtag(self, tag):
        if tag == "table":
            self._table = None

    def handle_data(self, data):  # keyed by the latest opening tag: <title>TEXT and <td>TEXT land under their tag
        self.texts.setdefault(self.tags[-1] if self.tags else "", []).append(data)

    def text_of(self, tag: str) -> list[str]:
        return self.texts.get(tag, [])


def parse(page: str) -> _Tables:
    tables = _Tables()
    tables.feed(page)
    tables.close()
    return tables


def summary_of(page: str) -> str:
    """The page's summary sentence, whitespace collapsed as a browser shows it, without its final full stop."""
    text = re.search(r'<p id="summary">(.*?)<span', page, re.S).group(1)
    return " ".join(text.split()).removesuffix(".")


def assert_self_contained(text: str) -> None:
    """No script and no address of anything outside the folder: no URL scheme, no CSS url() or @import."""
    assert "<script" not in text.lower()
    assert "://" not in text and "url(" not in text.lower() and "@import" not in text.lower()


def test_html_report_flags_exactly_the_injected_regressions(built, records, capsys):
    root, results = built
    out = root / "html"
    assert main(["report", "--history", str(root / "history"), "--baselines", str(root / "baselines"),
                 "--out", str(out)]) == 0
    expected = expected_regressions()
    assert f"{len(expected)} flagged regressions" in capsys.readouterr().out
    page = (out / "index.html").read_text()
    tables = parse(page)
    assert tables.regressions and len(tables.regressions) == len(set(tables.regressions))
    assert set(tables.regressions) == expected
    statuses = {(case, hw): s for case, hw, s in tables.status}
    assert set(statuses) == records["pairs"] and len(tables.status) == len(records["pairs"])
    assert statuses[ACCEPTANCE_CASE, "cpu"] == statuses[SPEED_CASE, GPU] == "regression"
    assert statuses[SPEED_CASE, "cpu"] == "pass"
    # per case: one chart per trend metric (the split ones once per hardware class), then per-position
    per_case = len(TREND_METRICS) - len(SPLIT_METRICS) + len(SPLIT_METRICS) * len(records["classes"]) + 1
    assert per_case == 3 + len(records["classes"]) + 1  # acceptance, MAL, speedup, tokens/s on each class
    assert tables.svgs == len(records["cases"]) * per_case
    assert tables.scripts == 0 and tables.external == []  # works from file://, fetches nothing
    assert_self_contained(page)
    assert [p.name for p in out.iterdir()] == ["index.html"]  # one static folder
    assert records["gpu_runs"] > 0 and page.count(f'<td class="text">{GPU_DRIVER}</td>') == records["gpu_runs"]
    assert len(results) <= MAX_ENV_ROWS and tables.env_rows == 1 + len(results)  # header + one row per run
    plotted = [k for k in expected if k[1] in TREND_METRICS]  # s/token is flagged, not plotted
    assert page.count('class="regression-marker"') == len(plotted)
    assert summary_of(page) == (f"{len(results)} runs of {len(records['cases'])} cases over {len(records['commits'])} commits "
                       f"on {len(records['classes'])} hardware classes ({', '.join(records['classes'])}); "
                       f"{len(expected)} flagged regressions")


def test_markdown_summary_flags_exactly_the_injected_regressions(built, capsys):
    root, _ = built
    assert main(["report", "--history", str(root / "history"), "--baselines", str(root / "baselines"),
                 "--format", "markdown"]) == 0
    text = capsys.readouterr().out
    section = text.split("### Regressions flagged over the history")[1].split("###")[0]
    rows = [[c.strip().strip("`") for c in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| case")]
    assert {(r[0], r[1], r[2], r[3]) for r in rows} == expected_regressions()
    assert len(rows) == len(expected_regressions())
    status = text.split("### Latest run per case vs baseline")[1]
    assert re.search(rf"\| {re.escape(SPEED_CASE)} \| {GPU} \|.*\*\*regression\*\* \|", status)
    assert re.search(rf"\| {re.escape(SPEED_CASE)} \| cpu \|.* pass \|", status)


def test_json_report_lists_the_regressions_with_before_after_and_change(built, records):
    root, results = built
    assert main(["report", "--history", str(root / "history"), "--baselines", str(root / "baselines"),
                 "--format", "json", "--out", str(root / "json")]) == 0
    payload = json.loads((root / "json" / "report.json").read_text())
    keys = {(r["case"], r["metric"], r["hardware_class"], r["commit"]) for r in payload["regressions"]}
    assert keys == expected_regressions()
    for r in payload["regressions"]:
        assert r["relative_change"] == pytest.approx(r["after"] / r["before"] - 1)
    assert payload["num_runs"] == len(results)
    assert payload["cases"] == records["cases"] and payload["hardware_classes"] == records["classes"]


def test_report_bad_input_exits_2(tmp_path, capsys):
    assert main(["report", "--history", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["report", "--history", str(tmp_path), "--baselines", str(tmp_path / "none")]) == 2
    assert "baseline directory" in capsys.readouterr().err


# ---- counted nouns ----------------------------------------------------------------------------------------


def test_plural_counts_the_noun():
    assert [plural(n, "run") for n in (0, 1, 2)] == ["0 runs", "1 run", "2 runs"]
    assert plural(1, "hardware class", "hardware classes") == "1 hardware class"
    assert plural(2, "hardware class", "hardware classes") == "2 hardware classes"


def small_history(root, n: int):
    """n cases x n commits x n hardware classes, one run each, gated nowhere; and n regressions to show."""
    classes = ["cpu", GPU][:n]
    cases = [f"demo/case-{c}" for c in range(n)]
    results = [synthetic_result(case_id, hw, commit(i), START + timedelta(hours=i, seconds=10 * c + h),
                                acceptance=0.5, tokens_per_s=40.0, plain_tokens_per_s=20.0, ttft=0.05)
               for i in range(n) for c, case_id in enumerate(cases) for h, hw in enumerate(classes)]
    append_results(root / "history", results)
    regressions = [Regression(cases[0], "acceptance_rate", classes[0], commit(0), None, START.isoformat(), 0.6, 0.5,
                              -1 / 6, 0.05, HIGHER_IS_BETTER, 3, 3, float(k + 10)) for k in range(n)]
    return load_history(root / "history"), regressions, results


@pytest.mark.parametrize("n", [1, 2])
def test_summaries_pluralise_their_counts(tmp_path, n):
    history, regressions, results = small_history(tmp_path, n)
    assert len(results) == n ** 3
    status = status_rows(history, None)
    page = render_html(history, regressions, status)
    classes = ", ".join(sorted({r["env"]["hardware_class"] for r in results}))
    if n == 1:
        summary = f"1 run of 1 case over 1 commit on 1 hardware class ({classes}); 1 flagged regression"
        case_head, markdown = "(1 run, 1 commit)", (f"1 run of 1 case on 1 hardware class ({classes}): "
                                                     "**1 step regression** over the history, **0 of 1** latest run "
                                                     "failing its gate.")
    else:
        summary = f"8 runs of 2 cases over 2 commits on 2 hardware classes ({classes}); 2 flagged regressions"
        case_head, markdown = "(4 runs, 2 commits)", (f"8 runs of 2 cases on 2 hardware classes ({classes}): "
                                                      "**2 step regressions** over the history, **0 of 4** latest "
                                                      "runs failing their gates.")
    assert summary_of(page) == summary
    assert page.count(f'<span class="muted">{case_head}</span>') == n
    assert markdown in render_markdown(history, regressions, status).splitlines()


# ---- untrusted text ---------------------------------------------------------------------------------------

EVIL = "<script>alert(1)</script>\"&'"  # one "/", so it is also a valid suite/name case id


def test_untrusted_text_is_escaped_in_every_output(tmp_path, monkeypatch):
    evil_label = f"acceptance {EVIL}"
    monkeypatch.setitem(METRIC_LABELS, "acceptance_rate", evil_label)  # status header and chart titles
    hw, commits = f"gpu {EVIL}", [f"{EVIL}{i}" for i in range(4)]
    results = [synthetic_result(case_id, hardware_class, commits[i], START + timedelta(hours=i, seconds=c),
                                acceptance=0.5, tokens_per_s=40.0, plain_tokens_per_s=20.0, ttft=0.05)
               for i in range(len(commits)) for c, (case_id, hardware_class) in enumerate([(EVIL, hw), (EVIL, "cpu")])]
    append_results(tmp_path / "history", results)
    history = load_history(tmp_path / "history")
    regressions = [Regression(EVIL, metric, hw, commits[2], commits[1], START.isoformat(), 0.6, 0.5, -1 / 6, 0.05,
                              HIGHER_IS_BETTER, 3, 3, 9.0) for metric in ("acceptance_rate", EVIL)]
    status = status_rows(history, None)
    out = write_html_report(tmp_path / "site", render_html(history, regressions, status, source=EVIL)).parent

    files = [p for p in out.rglob("*") if p.is_file()]
    assert files
    for path in files:
        assert_self_contained(path.read_text())
    page = (out / "index.html").read_text()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "\"&'" not in page and "&amp;lt;" not in page and "&amp;#" not in page  # escaped once, not twice
    tables = parse(page)
    assert tables.scripts == 0 and "script" not in tables.tags
    # the parser gives the strings back exactly: escaped in text and in attribute values, never cut
    assert {(EVIL, m, hw, commits[2]) for m in ("acceptance_rate", EVIL)} == set(tables.regressions)
    assert {(EVIL, hw), (EVIL, "cpu")} == {(c, h) for c, h, _ in tables.status}
    assert {EVIL, hw, evil_label} <= set(tables.text_of("td"))  # case, class, metric label; EVIL: the raw metric
    assert evil_label in tables.text_of("th")  # the status table's column head
    assert f"{evil_label} ({chr(0x2191)} better)" in tables.text_of("title")  # an SVG chart's title
    assert any(t.startswith(f"{hw}: {EVIL}: acceptance_rate on {hw}") for t in tables.text_of("title"))  # marker
    assert hw in tables.text_of("text")  # an SVG legend
    assert any(EVIL in t for t in tables.text_of("span"))  # "from <source>"
    assert EVIL in tables.attributes and commits[2] in tables.attributes

    markdown = render_markdown(history, regressions, status)
    outside_code = re.sub(r"`[^`]*`", "", markdown)  # code spans are literal: GitHub shows them as text
    assert "<script" not in outside_code and "&lt;script>alert(1)&lt;/script>" in outside_code


def test_templates_autoescape_and_fail_loudly_on_a_missing_variable():
    env = template_environment()
    assert env.autoescape("index.html") and not env.autoescape("dashboard.css")
    assert env.from_string("{{ x }}").render(x="<b>") == "&lt;b&gt;"
    with pytest.raises(jinja2.UndefinedError):
        env.get_template("index.html").render()


# ---- module hygiene -----------------------------------------------------------------------------------------

def test_report_modules_are_small_and_say_what_they_are_for():
    modules = sorted(REPORT_DIR.glob("*.py"))
    templates = sorted((REPORT_DIR / "templates").iterdir())
    assert modules and templates
    for path in modules + templates:
        assert len(path.read_text().splitlines()) <= 400, path
    for path in modules:
        doc = ast.get_docstring(ast.parse(path.read_text()))
        assert doc, f"{path} has no docstring saying what the module is for"
    for path in templates:
        first = path.read_text().splitlines()[0]
        assert path.suffix == ".css" or first.startswith("{#"), f"{path} does not start with a purpose comment"
