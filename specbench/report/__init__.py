"""The CI dashboard over the results history: detect step changes, and render them as a static HTML
folder, a Markdown summary or JSON (``specbench report``, ``specbench check``)."""

from specbench.report.changes import Regression, detect_regressions

__all__ = ["Regression", "detect_regressions"]
