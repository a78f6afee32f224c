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


def random_prompt(length: int, seed: int, vocab_size: int = 256) -> torch.Tensor:
    return torch.randint(0, vocab_size, (length,), generator=torch.Generator().manual_seed(seed))


def repetitive_prompt(seed: int, vocab_size: int = 256) -> torch.Tensor:
    """A prompt that repeats a random phrase, so n-gram lookup finds matches."""
    phrase = random_prompt(6, seed, vocab_size)
    return torch.cat([phrase, random_prompt(3, seed + 100, vocab_size), phrase, phrase[:3]])


def pytest_configure(config):
    # One thread per test process: the tiny models here are far too small to gain from intra-op
    # threads, and spinning idle threads slow everything on a 2-core machine under xdist. Denormal
    # floats make CPU Adam several times slower in the training tests.
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
