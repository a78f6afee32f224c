"""Baselines and gates per point of a batch-size curve: batch_speedup and throughput gated per point, unbatched
cases skip them saying why, schema 3 files migrate to 4 with the same verdicts, a real batched run regenerates
and passes, and the dashboard draws the measured curve beside the baseline's."""

from __future__ import annotations

import copy
import json
import math
import random
from html.parser import HTMLParser

import pytest
from _synthetic_results import make_result

from specbench.gating.baselines import BaselineStore, compare
from specbench.gating.gates import BATCH_SPEED_METRICS
from specbench.gating.migrate import ADDED_SPEED_METRICS, SCHEMA_VERSION
from specbench.gating.regenerate import update_baseline

GPU = "NVIDIA H200"
CURVE = "chain-k3"


def batch_point(batch_size: int, *, seed: int = 0, speedup_scale: float = 1.0, throughput_scale: float = 1.0,
                num_repeats: int = 3, hardware_class: str = GPU) -> dict:
    """A synthetic result of the point ``CURVE[batch_size=B]``: make_result's requests plus, per repeat, the batch
    figures run/batch.py records (throughput grows with B, batch speedup falls with it), and their medians."""
    result = make_result(seed=seed, num_repeats=num_repeats, hardware_class=hardware_class, name=CURVE)
    name = f"{CURVE}[batch_size={batch_size}]"
    result["case"].update(name=name, engine="static", batch_size=batch_size)
    result["case_id"] = f"medusa/{name}"
    for record in result["repeats"]:
        rng = random.Random(seed * 7919 + record["repeat"] * 31 + batch_size)
        plain = 60.0 * batch_size * rng.gauss(1.0, 0.02)
        speedup = (1.6 / (1 + 0.1 * batch_size)) * speedup_scale * rng.gauss(1.0, 0.02)
        record.update(plain_throughput_tokens_per_s=plain, batch_speedup=speedup,
                      throughput_tokens_per_s=plain * speedup * throughput_scale / speedup_scale)
    for name in ("throughput_tokens_per_s", "plain_throughput_tokens_per_s", "batch_speedup"):
        result["metrics"][name] = sorted(r[name] for r in result["repeats"])[num_repeats // 2]
    result["metrics"].update(batch_size=batch_size, queue_s=0.01 * batch_size, peak_memory_bytes=None)
    return result


@pytest.fixture()
def store(tmp_path):
    for size in (1, 2):
        update_baseline(batch_point(size), tmp_path, command="pytest tests/test_batch_gates.py", reason="test")
    return tmp_path


def test_a_batch_point_gated_against_its_own_baseline_passes(store):
    report = compare(batch_point(2, seed=1), store)
    assert report.passed, report.format()
    for name in BATCH_SPEED_METRICS:
        check = report.check(name)
        assert check.status == "pass" and check.ci is not None, check.message()  # repeat-level interval
    assert report.check("batch_speedup").baseline == pytest.approx(batch_point(2)["metrics"]["batch_speedup"], rel=1e-5)


@pytest.mark.parametrize("metric, changes", [("batch_speedup", {"speedup_scale": 0.8}),
                                             ("throughput_tokens_per_s", {"throughput_scale": 0.8})])
def test_a_20_percent_drop_fails_naming_the_metric_and_the_point(store, metric, changes):
    report = compare(batch_point(2, seed=1, **changes), store)
    assert not report.passed
    assert [c.name for c in report.failures] == [metric]
    message = report.failures[0].message()
    assert message.startswith(f"medusa/{CURVE}[batch_size=2]: {metric} regressed"), message
    assert compare(batch_point(1, seed=1), store).passed  # the other point of the curve is untouched


def test_batch_speedup_is_a_same_run_ratio_gated_under_gate_speed_ratios(store):
    run = batch_point(2, seed=1, speedup_scale=0.8)
    run["case"]["gate_speed"] = "ratios"
    report = compare(run, store)
    assert report.check("batch_speedup").status == "regression"
    assert report.check("throughput_tokens_per_s").status == "skipped"  # absolute: left to GPU-bound cases


def test_an_unbatched_case_has_no_batch_checks(tmp_path):
    # a batch point's metrics say nothing about an unbatched run: no check, so no skip line in every report
    update_baseline(make_result(seed=0), tmp_path, command="pytest", reason="test")
    report = compare(make_result(seed=1), tmp_path)
    assert report.passed
    names = {check.name for check in report.checks}
    assert names.isdisjoint(BATCH_SPEED_METRICS) and "speedup" in names


def test_a_batch_point_can_take_its_quality_from_the_unbatched_case(tmp_path):
    unbatched = make_result(seed=0, hardware_class=GPU, name=CURVE, num_repeats=3)
    update_baseline(unbatched, tmp_path, command="pytest", reason="test")
    run = batch_point(2, seed=0)
    run["case"]["quality_baseline"] = CURVE
    report = compare(run, tmp_path)
    assert report.quality_baseline == f"medusa/{CURVE}"
    assert report.check("acceptance_rate").status == "pass"  # the same tokens at every B
    assert report.check("batch_speedup").status == "no_baseline"  # speed stays per point


def as_schema_3(data: dict) -> dict:
    """The same file before schema 4: no batch-point metrics in its speed sections."""
    data = copy.deepcopy(data)
    data["schema"] = 3
    for entry in data["cases"].values():
        for speed in entry["speed"].values():
            for name in ADDED_SPEED_METRICS[4]:
                speed["metrics"].pop(name)
    return data


def test_schema_3_to_4_adds_null_batch_metrics_and_keeps_every_verdict(tmp_path, capsys):
    from specbench.cli import main

    new_dir, old_dir = tmp_path / "new", tmp_path / "old"
    update_baseline(make_result(seed=0, hardware_class=GPU), new_dir, command="pytest", reason="test")
    old_dir.mkdir()
    data = json.loads((new_dir / "medusa.json").read_text())
    (old_dir / "medusa.json").write_text(json.dumps(as_schema_3(data)))
    for run in (make_result(seed=1, hardware_class=GPU), make_result(seed=1, hardware_class=GPU, speed_scale=0.7)):
        old, new = compare(run, old_dir), compare(run, new_dir)
        assert [(c.name, c.status, c.reason, c.ci) for c in old.checks] == [
            (c.name, c.status, c.reason, c.ci) for c in new.checks]
    assert main(["baselines", "migrate", "--baselines", str(old_dir)]) == 0
    assert capsys.readouterr().out.strip() == f"{old_dir / 'medusa.json'}: schema 3 -> 4 (1 cases)"
    rewritten = json.loads((old_dir / "medusa.json").read_text())
    assert rewritten["schema"] == SCHEMA_VERSION == 4
    metrics = rewritten["cases"]["medusa-chain-k3"]["speed"][GPU]["metrics"]
    assert all(metrics[name] is None for name in ADDED_SPEED_METRICS[4])


def test_a_real_batched_run_regenerates_and_passes_against_itself(tmp_path, capsys):
    from specbench.cli import main
    from test_batch_cases import toml_case

    suite = toml_case(tmp_path / "curve.toml", batch_sizes=[1, 2], gate_speed=False,
                      prompts={"name": "gsm8k-embedded", "num_prompts": 2}, max_new_tokens=6)
    baselines = tmp_path / "baselines"
    assert main(["run", suite, "--update-baselines", "--reason", "test", "--baselines", str(baselines),
                 "--no-history", "-q"]) == 0
    stored = BaselineStore(baselines).load("batch")["cases"]
    assert sorted(stored) == ["chain[batch_size=1]", "chain[batch_size=2]"]
    for name, entry in stored.items():
        speed = entry["speed"]["cpu"]
        assert all(math.isfinite(speed["metrics"][m]) for m in BATCH_SPEED_METRICS), name
        assert [r["batch_speedup"] for r in speed["repeats"]] == [speed["metrics"]["batch_speedup"]]
        assert entry["quality"]["metrics"]["acceptance_rate"] is not None
    capsys.readouterr()
    assert main(["run", suite, "--baselines", str(baselines), "--no-history", "-q"]) == 0
    out = capsys.readouterr().out
    assert "batch/chain[batch_size=1]: PASSED" in out and "batch/chain[batch_size=2]: PASSED" in out


class _Curves(HTMLParser):
    """The batch-curve blocks of the dashboard: (curve, hardware class) -> the data-series JSON, and svg titles."""

    def __init__(self):
        super().__init__()
        self.series, self.titles, self._in_title = {}, [], False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "div" and "data-series" in a:
            self.series[a["data-curve"], a["data-hardware-class"]] = json.loads(a["data-series"])
        self._in_title = tag == "title"

    def handle_data(self, data):
        if self._in_title:
            self.titles.append(data)
            self._in_title = False


@pytest.fixture()
def dashboard(tmp_path):
    """A history of a two-point curve (measured at 90% of the baseline's batch speedup) rendered by `specbench report`."""
    from specbench.gating.history import append_results
    from specbench.report.arguments import main

    baselines = tmp_path / "baselines"
    for size in (1, 2):
        update_baseline(batch_point(size), baselines, command="pytest", reason="test")
    runs = [batch_point(size, seed=1, speedup_scale=0.9) for size in (1, 2)] + [make_result(seed=1)]
    append_results(tmp_path / "history", runs)
    site = tmp_path / "site"
    assert main(["report", "--history", str(tmp_path / "history"), "--baselines", str(baselines),
                 "--out", str(site)]) == 0
    return site, runs


def test_the_dashboard_draws_the_measured_curve_beside_the_baseline_curve(dashboard):
    site, runs = dashboard
    parser = _Curves()
    parser.feed((site / "index.html").read_text(encoding="utf-8"))
    assert list(parser.series) == [(f"medusa/{CURVE}", GPU)]  # the unbatched case forms no curve
    series = parser.series[f"medusa/{CURVE}", GPU]
    for metric in BATCH_SPEED_METRICS:
        assert [b for b, _ in series["measured"][metric]] == [b for b, _ in series["baseline"][metric]] == [1, 2]
        measured = [r["metrics"][metric] for r in runs[:2]]
        stored = [batch_point(b)["metrics"][metric] for b in (1, 2)]
        assert [v for _, v in series["measured"][metric]] == pytest.approx(measured, rel=1e-9)
        assert [v for _, v in series["baseline"][metric]] == pytest.approx(stored, rel=1e-5)  # 6 significant digits
    # the batch speedup says what it is: not the status table's speedup (mean per-request tok/s over plain's)
    assert f"batch speedup (throughput ÷ plain throughput) vs batch size on {GPU} (↑ better)" in parser.titles
    assert f"throughput (tokens/s) vs batch size on {GPU} (↑ better)" in parser.titles
    assert any(t.startswith("baseline B=2: ") for t in parser.titles)  # a dot of the dashed baseline series


def test_the_curve_renders_in_headless_chromium(dashboard):
    from specbench.report.screenshot import capture, find_chromium

    if find_chromium() is None:
        pytest.skip("no Chromium on PATH (Debian: /usr/bin/chromium); install it with `bash .ci/install-browser.sh`")
    site, _ = dashboard
    shot = capture(site, screenshot=site.parent / "page.png", window_size=(1400, 1400))
    assert shot.console == [], "\n".join(shot.console)
    assert shot.dom.count('class="chart batch-curve"') == 2
    assert shot.dom.count("<circle") >= 8  # 2 points x (measured, baseline) x 2 charts, plus the trend charts'
