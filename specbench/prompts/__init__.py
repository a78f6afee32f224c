"""Prompt-set internals behind :mod:`specbench.datasets` (record sources and file parsing)."""
