"""The CI dashboard over the results history: detect step changes, and render them as a static HTML
folder, a Markdown summary or JSON (``specbench report``, ``specbench check``)."""

__all__ = ["Regression", "detect_regressions"]


def __getattr__(name: str):
    # imported on first use: the CLI's argument parser reaches this package without needing numpy or pandas
    if name in __all__:
        from specbench.report import changes

        return getattr(changes, name)
    raise AttributeError(f"module 'specbench.report' has no attribute {name!r}")
