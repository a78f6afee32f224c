"""Open a report in headless Chromium: a PNG screenshot, the rendered DOM and the page's console messages.

    python -m specbench.report.screenshot REPORT_DIR_OR_INDEX_HTML OUT.png

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
TIMEOUT_S = 120
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


def find_chromium() -> str | None:
    return next((path for path in map(shutil.which, CHROMIUM_NAMES) if path), None)


def page_url(report: str | Path) -> str:
    """The file:// URL of ``report`` (an index.html or a folder holding one)."""
    path = Path(report).resolve()
    if path.is_dir():
        path = path / "index.html"
    if not path.is_file():
        raise FileNotFoundError(f"no report page at {path}; write one with `specbench report --out DIR`")
    return path.as_uri()


def capture(report: str | Path, *, screenshot: str | Path | None = None, window_size=WINDOW_SIZE,
            timeout_s: float = TIMEOUT_S) -> BrowserCapture:
    """Render ``report`` once: DOM, console lines and (optionally) a screenshot of the window."""
    chromium = find_chromium()
    if chromium is None:
        raise BrowserUnavailable(f"no Chromium found (looked for {', '.join(CHROMIUM_NAMES)} on PATH); "
                                 "install it with `bash .ci/install-browser.sh`")
    url = page_url(report)
    with tempfile.TemporaryDirectory(prefix="specbench-chromium-") as profile:
        command = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
                   f"--window-size={window_size[0]},{window_size[1]}", "--dump-dom"]
        if screenshot is not None:
            screenshot = Path(screenshot).resolve()
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            command.append(f"--screenshot={screenshot}")
        done = subprocess.run([*command, url], capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{chromium} exited with {done.returncode} on {url}:\n{done.stderr[-4000:]}")
    console = [line for line in done.stderr.splitlines() if _CONSOLE_LINE.search(line) or "Uncaught" in line]
    if screenshot is not None and not screenshot.is_file():
        raise RuntimeError(f"{chromium} wrote no screenshot to {screenshot}:\n{done.stderr[-4000:]}")
    return BrowserCapture(dom=done.stdout, console=console, screenshot=screenshot, log=done.stderr)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] in ("-h", "--help"):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    try:
        result = capture(args[0], screenshot=args[1])
    except (BrowserUnavailable, FileNotFoundError) as err:
        print(f"specbench screenshot: error: {err}", file=sys.stderr)
        return 2
    for line in result.console:
        print(f"console: {line}", file=sys.stderr)
    print(f"wrote {result.screenshot}")
    return 1 if result.console else 0


if __name__ == "__main__":
    sys.exit(main())
