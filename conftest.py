"""Repository-level pytest configuration: the repo root on sys.path, so tests import `tests.*` helpers."""
