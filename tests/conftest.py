"""Fixtures shared by the framework's unit tests: tiny seeded targets and prompts."""

from __future__ import annotations

import pytest
import torch

from specbench.checkpoints.tiny import tiny_llama
from specbench.engine.hf_target import HFTarget


@pytest.fixture(scope="session")
def tiny_model():
    return tiny_llama(seed=0)


@pytest.fixture()
def tiny_target(tiny_model):
    return HFTarget(tiny_model)


@pytest.fixture(autouse=True)
def _private_results_history(tmp_path_factory, monkeypatch):
    # the pytest plugin and `specbench run` append to the default results history (.specbench/history at
    # the repo root); unit tests, pytester runs included, record into a temporary directory instead
    monkeypatch.setenv("SPECBENCH_HISTORY_DIR", str(tmp_path_factory.getbasetemp() / "results-history"))


@pytest.fixture(autouse=True)
def _quiet_cpu(monkeypatch):
    # `specbench run` sets torch's threads from this machine's load (specbench/cpu_threads.py) and says when the
    # CPU is shared: in-process runs here see a quiet one-core machine instead, so that their output does not
    # depend on what else runs (xdist's other worker), and they keep pytest_configure's one thread
    from specbench import cpu_threads

    monkeypatch.setattr(cpu_threads, "usable_cores", lambda: 1)
    monkeypatch.setattr(cpu_threads, "other_load", lambda: 0.0)
    monkeypatch.setattr(cpu_threads, "load_1min", lambda: 0.0)
    monkeypatch.setattr(cpu_threads, "_applied", None)


def pytest_configure(config):
    # One thread per test process: the tiny models here are far too small to gain from intra-op
    # threads, and spinning idle threads slow everything on a 2-core machine under xdist. Denormal
    # floats make CPU Adam several times slower in the training tests.
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
