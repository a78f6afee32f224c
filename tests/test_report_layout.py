"""The dashboard's layout: a full-page screenshot at --width, an environment table that fits the page, trend
charts that say when one commit makes no trend, y axes from the metric's floor (not zoomed into noise), axis
labels in words. The browser checks skip without Chromium (`bash .ci/install-browser.sh` installs it)."""

from __future__ import annotations

import copy
import re

import pytest

from specbench.gating.history import append_results
from specbench.report.arguments import main
from specbench.report.html import ONE_COMMIT
from specbench.report.screenshot import find_chromium, measure
from specbench.report.svg import Line, line_chart
from tests._history_fixtures import build_history

needs_chromium = pytest.mark.skipif(
    find_chromium() is None,
    reason="no Chromium on PATH (Debian: /usr/bin/chromium); install it with `bash .ci/install-browser.sh`")
# a real environment record's platform string and a long case name: what made the table overflow 1400 px
LONG_PLATFORM = "Linux-6.8.0-1019-gcp-x86_64-with-glibc2.36-and-a-long-vendor-kernel-suffix-for-good-measure"
SVG_TEXT = re.compile(r"<text[^>]*>([^<]*)</text>")


def _site(tmp_path, *, long_values: bool = False):
    results = build_history(tmp_path / "history", tmp_path / "baselines")
    if long_values:
        extra = copy.deepcopy(results[-1])
        extra["env"]["platform"] = LONG_PLATFORM
        extra["env"]["gpu_name"] = "NVIDIA H200 NVL with an unusually long marketing name (144 GB HBM3e)"
        append_results(tmp_path / "history", [extra])
    assert main(["report", "--history", str(tmp_path / "history"), "--baselines", str(tmp_path / "baselines"),
                 "--out", str(tmp_path / "site")]) == 0
    return tmp_path / "site"


def _one_commit_site(tmp_path):
    results = build_history(tmp_path / "all", None)
    commit = results[0]["env"]["git_commit"]
    append_results(tmp_path / "history", [r for r in results if r["env"]["git_commit"] == commit])
    assert main(["report", "--history", str(tmp_path / "history"), "--out", str(tmp_path / "site")]) == 0
    return (tmp_path / "site" / "index.html").read_text(encoding="utf-8")


def test_a_one_commit_history_says_it_has_no_trend_yet(tmp_path):
    page = _one_commit_site(tmp_path)
    trends = page[page.index('id="trends"'):page.index('id="environments"')]
    assert trends.count(ONE_COMMIT) >= 4  # every trend chart of every case


def test_a_many_commit_history_draws_trends_without_the_note(tmp_path):
    assert ONE_COMMIT not in (_site(tmp_path) / "index.html").read_text(encoding="utf-8")


def test_rates_are_drawn_from_zero_so_noise_is_not_a_cliff():
    # the reported chart: acceptance between 0.7485 and 0.751 filled the whole height
    noisy = [Line("cpu", "#000", [(i, y, "") for i, y in enumerate((0.7485, 0.751, 0.7492))])]
    zoomed = SVG_TEXT.findall(line_chart("acceptance", noisy))
    floored = SVG_TEXT.findall(line_chart("acceptance", noisy, y_floor=0.0))
    assert "0" not in zoomed  # the old axis started near 0.748
    assert "0" in floored and "0.8" in floored


def test_axes_are_labelled_in_words(tmp_path):
    page = (_site(tmp_path) / "index.html").read_text(encoding="utf-8")
    texts = SVG_TEXT.findall(page)
    raw = [t for t in texts if t in ("acceptance_rate", "mean_acceptance_length", "tokens_per_s",
                                     "throughput_tokens_per_s", "batch_speedup", "rate")]
    assert not raw, raw
    assert "acceptance rate" in texts and "tokens/s" in texts


@needs_chromium
def test_the_screenshot_is_the_whole_page_at_the_width(tmp_path, capsys):
    image_module = pytest.importorskip("PIL.Image", reason="Pillow is needed to read the screenshot")
    site = _site(tmp_path)
    capsys.readouterr()
    shot = tmp_path / "page.png"
    assert main(["report", "--history", str(tmp_path / "history"), "--baselines", str(tmp_path / "baselines"),
                 "--out", str(site), "--screenshot", str(shot), "--width", "1200"]) == 0
    height = measure(site, 1200).height
    assert height > 2000  # taller than the old fixed window: a top-only capture would be cut
    with image_module.open(shot) as image:
        assert image.size == (1200, height)
        bottom = image.convert("L").crop((0, height - 400, 1200, height))  # the environment table is at the end
        assert min(bottom.getdata()) < 128  # text there, not an empty strip
    assert f"the whole page, 1200 x {height} px" in capsys.readouterr().out


@needs_chromium
@pytest.mark.parametrize("width", [1400, 1280])
def test_the_environment_table_fits_the_page(tmp_path, width):
    layout = measure(_site(tmp_path, long_values=True), width)
    assert layout.scroll_width <= width and layout.widest_right <= width, layout
