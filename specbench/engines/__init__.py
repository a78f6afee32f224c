"""Engines under test: external inference engines (vLLM first) that run a case behind one interface
(``specbench.engines.interface``) and return specbench's result shape, with a conformance verdict against
specbench's own engine (docs/conformance.md). Adding an engine is one module named here."""

from __future__ import annotations

from importlib import import_module

# case key ``engine`` -> the module implementing engines.interface for it; imported only when a case uses it
EXTERNAL_ENGINES = {"vllm": "specbench.engines.vllm_engine"}


def engine_module(name: str):
    """The module of the engine under test called ``name``."""
    if name not in EXTERNAL_ENGINES:
        raise ValueError(f"engine {name!r} is not an engine under test; those are: {', '.join(EXTERNAL_ENGINES)}")
    return import_module(EXTERNAL_ENGINES[name])
