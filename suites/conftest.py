"""Regression suites: cases from specbench/cases/<suite>.toml, run and gated by specbench's plugin."""
