"""specbench: a test harness and regression benchmarks for speculative decoding."""

__version__ = "0.1.0"
