"""Results history and the CI dashboard: append runs to a history directory, detect step changes over it,
and render them as a static HTML folder, a Markdown summary or JSON (``specbench report``, ``specbench check``).
"""

from specbench.report.changes import Regression, detect_regressions
from specbench.report.history import HistoryError, append_results, history_record, load_history

__all__ = ["HistoryError", "Regression", "append_results", "detect_regressions", "history_record", "load_history"]
