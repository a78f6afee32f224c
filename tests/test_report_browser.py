"""The HTML report in a real browser: headless Chromium renders it from file:// without console errors, the
screenshot is not blank, the plots are in the rendered DOM and the status table shows the expected values.
"""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from specbench.report.arguments import main
from specbench.report.screenshot import capture, find_chromium
from specbench.report.screenshot import main as screenshot_main
from tests._history_fixtures import ACCEPTANCE_CASE, CASES, GPU, HARDWARE_CLASSES, SPEED_CASE, build_history, latest

pytestmark = pytest.mark.skipif(
    find_chromium() is None,
    reason="no Chromium on PATH (Debian: /usr/bin/chromium); install it with `bash .ci/install-browser.sh`")


class _Cells(HTMLParser):
    """Text of the status table's cells, keyed by (case, hardware class, cell class, metric); svg and circle counts."""

    def __init__(self):
        super().__init__()
        self.cells, self.row, self.key, self.svgs, self.circles = {}, None, None, 0, 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.svgs += tag == "svg"
        self.circles += tag == "circle"
        if tag == "tr" and a.get("class") == "status-row":
            self.row = (a["data-case"], a["data-hardware-class"])
        elif tag == "td" and self.row and "data-metric" in a:
            self.key = (*self.row, a["class"].split()[0], a["data-metric"])
            self.cells[self.key] = ""

    def handle_endtag(self, tag):
        if tag == "td":
            self.key = None
        elif tag == "tr":
            self.row = None

    def handle_data(self, data):
        if self.key:
            self.cells[self.key] += data


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser")
    results = build_history(root / "history", root / "baselines")
    assert main(["report", "--history", str(root / "history"), "--baselines", str(root / "baselines"),
                 "--out", str(root / "site")]) == 0
    shot = capture(root / "site", screenshot=root / "page.png", window_size=(1400, 2000))
    cells = _Cells()
    cells.feed(shot.dom)
    return shot, cells, results


def test_page_renders_without_console_errors(rendered):
    shot, _, _ = rendered
    assert shot.console == [], "\n".join(shot.console)


def test_console_errors_are_caught(tmp_path):
    # the check above is only worth something if a page error does show up in what capture() returns
    page = "<html><body><script>throw new Error('planted failure')</script></body></html>"
    (tmp_path / "index.html").write_text(page)
    assert any("Uncaught Error: planted failure" in line for line in capture(tmp_path).console)


def test_screenshot_is_not_blank(rendered):
    image_module = pytest.importorskip("PIL.Image", reason="Pillow is needed to read the screenshot")
    shot, _, _ = rendered
    with image_module.open(shot.screenshot) as image:
        assert image.size == (1400, 2000)
        gray = image.convert("L")
        histogram = gray.histogram()
    pixels = sum(histogram)
    mean = sum(i * n for i, n in enumerate(histogram)) / pixels
    variance = sum(n * (i - mean) ** 2 for i, n in enumerate(histogram)) / pixels
    dark = sum(histogram[:128]) / pixels
    # a blank or error page is one flat colour (variance ~0); text, tables and plots on white give variance in
    # the hundreds and at least a percent of dark pixels
    assert variance > 100, variance
    assert dark > 0.01, dark


def test_plots_are_in_the_rendered_dom(rendered):
    _, cells, results = rendered
    # per case: acceptance, MAL, speedup, tokens/s on each class, per-position acceptance
    assert cells.svgs == len(CASES) * (3 + len(HARDWARE_CLASSES) + 1)
    assert cells.circles >= len(results) * 4  # every run is a dot in each of its 4 trend charts


def test_status_table_shows_latest_baseline_delta_and_gate(rendered):
    _, cells, results = rendered
    run = latest(results, ACCEPTANCE_CASE, "cpu")["metrics"]["acceptance_rate"]
    assert cells.cells[ACCEPTANCE_CASE, "cpu", "measured", "acceptance_rate"] == f"{run:.3f}"
    assert cells.cells[ACCEPTANCE_CASE, "cpu", "baseline", "acceptance_rate"] == "0.600"  # fixture's level
    assert cells.cells[ACCEPTANCE_CASE, "cpu", "gate", "acceptance_rate"] == f"{(run / 0.6 - 1) * 100:+.1f}%REGRESSION"
    speed = latest(results, SPEED_CASE, GPU)["metrics"]["tokens_per_s"]
    assert cells.cells[SPEED_CASE, GPU, "measured", "tokens_per_s"] == f"{speed:.1f}"
    assert cells.cells[SPEED_CASE, GPU, "baseline", "tokens_per_s"] == "300.0"
    assert cells.cells[SPEED_CASE, GPU, "gate", "tokens_per_s"].endswith("REGRESSION")


def test_screenshot_command_writes_a_png(rendered, tmp_path, capsys):
    shot, _, _ = rendered
    out = tmp_path / "shot.png"
    assert screenshot_main([str(shot.screenshot.parent / "site"), str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert screenshot_main([str(tmp_path / "no-report"), str(out)]) == 2
    assert "no report page" in capsys.readouterr().err
