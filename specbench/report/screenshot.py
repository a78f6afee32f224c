"""Open a report in headless Chromium: a full-page PNG screenshot, the rendered DOM, the page's console messages
and its laid-out size.

    python -m specbench.report.screenshot REPORT_DIR_OR_INDEX_HTML OUT.png [WIDTH]

A screenshot is of Chromium's window, so a full-page one takes two launches: one lays the page out at the
width and measures it (a copy of the page with a measuring script; the report itself holds no script), the
other renders a window that tall.

Chromium is Debian's ``/usr/bin/chromium`` (``.ci/install-browser.sh``); it is started with networking
features off and a throw-away profile, so nothing leaves the machine and no state carries between runs.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--force-device-scale-factor=1")
WINDOW_SIZE = (1400, 2000)
DEFAULT_WIDTH = 1400
MAX_HEIGHT = 16384  # Chromium's largest window: a taller page is cut there (said in the capture's `clipped`)
TIMEOUT_S = 120
# the measuring copy writes the laid-out size into <body data-specbench-layout="HEIGHT WIDTH RIGHT">: the document's
# height and width, and the right edge of its widest table or chart (what overflows the window when it is wider)
_MEASURE = ("<script>(() => { const d = document.documentElement; const right = Math.max(0, ...Array.from("
            "document.querySelectorAll('table, svg'), e => Math.ceil(e.getBoundingClientRect().right))); "
            "document.body.setAttribute('data-specbench-layout', `${d.scrollHeight} ${d.scrollWidth} ${right}`); "
            "})();</script>")
_LAYOUT = re.compile(r'data-specbench-layout="(\d+) (\d+) (\d+)"')
# e.g. [..:INFO:CONSOLE:1] "Uncaught Error: x", source: file:///.../index.html (1)
_CONSOLE_LINE = re.compile(r":CONSOLE[:(]")


class BrowserUnavailable(RuntimeError):
    """No Chromium on PATH (install it with .ci/install-browser.sh)."""


@dataclass
class BrowserCapture:
    dom: str  # the DOM after rendering, serialised
    console: list[str] = field(default_factory=list)  # console lines the page produced (errors included)
    screenshot: Path | None = None
    log: str = ""  # Chromium's whole stderr, for failure messages
    layout: "Layout | None" = None  # the full-page capture's measured page


@dataclass(frozen=True)
class Layout:
    """A page laid out at ``width`` px: its full height and width, and the right edge of its widest table or chart."""

    width: int
    height: int
    scroll_width: int
    widest_right: int

    @property
    def clipped(self) -> bool:
        return self.height > MAX_HEIGHT


def find_chromium() -> str | None:
    return next((path for path in map(shutil.which, CHROMIUM_NAMES) if path), None)


def page_path(report: str | Path) -> Path:
    """The page of ``report`` (an index.html or a folder holding one)."""
    path = Path(report).resolve()
    if path.is_dir():
        path = path / "index.html"
    if not path.is_file():
        raise FileNotFoundError(f"no report page at {path}; write one with `specbench report --out DIR`")
    return path


def page_url(report: str | Path) -> str:
    """The file:// URL of ``report`` (an index.html or a folder holding one)."""
    return page_path(report).as_uri()


def _chromium() -> str:
    chromium = find_chromium()
    if chromium is None:
        raise BrowserUnavailable(f"no Chromium found (looked for {', '.join(CHROMIUM_NAMES)} on PATH); "
                                 "install it with `bash .ci/install-browser.sh`")
    return chromium


def _run(chromium: str, url: str, window_size, timeout_s: float, screenshot: Path | None = None):
    with tempfile.TemporaryDirectory(prefix="specbench-chromium-") as profile:
        command = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
                   f"--window-size={window_size[0]},{window_size[1]}", "--dump-dom"]
        if screenshot is not None:
            command.append(f"--screenshot={screenshot}")
        done = subprocess.run([*command, url], capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{chromium} exited with {done.returncode} on {url}:\n{done.stderr[-4000:]}")
    return done


def measure(report: str | Path, width: int = DEFAULT_WIDTH, *, timeout_s: float = TIMEOUT_S) -> Layout:
    """Lay ``report`` out at ``width`` px in Chromium and measure it (a copy of the page, with a measuring script)."""
    chromium = _chromium()
    page = page_path(report)
    text = page.read_text(encoding="utf-8")
    at = text.rfind("</body>")
    with tempfile.TemporaryDirectory(prefix="specbench-measure-") as scratch:
        copy = Path(scratch) / "index.html"
        copy.write_text(text[:at] + _MEASURE + text[at:] if at >= 0 else text + _MEASURE, encoding="utf-8")
        done = _run(chromium, copy.as_uri(), (width, 1000), timeout_s)
    found = _LAYOUT.search(done.stdout)
    if found is None:
        raise RuntimeError(f"{chromium} did not run the measuring script on a copy of {page}:\n{done.stderr[-4000:]}")
    height, scroll_width, right = map(int, found.groups())
    return Layout(width, height, scroll_width, right)


def capture(report: str | Path, *, screenshot: str | Path | None = None, window_size=None,
            width: int = DEFAULT_WIDTH, timeout_s: float = TIMEOUT_S) -> BrowserCapture:
    """Render ``report`` once: DOM, console lines and (optionally) a screenshot: of the whole page at ``width``
    (measured first, up to MAX_HEIGHT), or of a ``window_size`` window when one is given."""
    chromium = _chromium()
    url = page_url(report)
    layout = None
    if screenshot is not None:
        screenshot = Path(screenshot).resolve()
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        if window_size is None:
            layout = measure(report, width, timeout_s=timeout_s)
            window_size = (width, min(layout.height, MAX_HEIGHT))
    done = _run(chromium, url, window_size or WINDOW_SIZE, timeout_s, screenshot)
    console = [line for line in done.stderr.splitlines() if _CONSOLE_LINE.search(line) or "Uncaught" in line]
    if screenshot is not None and not screenshot.is_file():
        raise RuntimeError(f"{chromium} wrote no screenshot to {screenshot}:\n{done.stderr[-4000:]}")
    return BrowserCapture(dom=done.stdout, console=console, screenshot=screenshot, log=done.stderr, layout=layout)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3) or args[0] in ("-h", "--help") or (len(args) == 3 and not args[2].isdigit()):
        print(__doc__.strip().splitlines()[3].strip(), file=sys.stderr)
        return 2
    try:
        result = capture(args[0], screenshot=args[1], width=int(args[2]) if len(args) == 3 else DEFAULT_WIDTH)
    except (BrowserUnavailable, FileNotFoundError) as err:
        print(f"specbench screenshot: error: {err}", file=sys.stderr)
        return 2
    for line in result.console:
        print(f"console: {line}", file=sys.stderr)
    print(f"wrote {result.screenshot}")
    return 1 if result.console else 0


if __name__ == "__main__":
    sys.exit(main())
