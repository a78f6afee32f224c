"""Engines under test: external inference engines (vLLM first) that run a case behind one interface
(``specbench.engines.interface``) and return specbench's result shape, with a conformance verdict against
specbench's own engine (docs/conformance.md); specbench/run/external.py runs a case on them. Adding an engine is one
module, ``<name>_engine.py``, and its name in ``cases.ENGINES_UNDER_TEST``."""

from __future__ import annotations

from importlib import import_module

from specbench.cases import ENGINES_UNDER_TEST


def engine_module(name: str):
    """The module of the engine under test called ``name`` (imported only when a case uses it)."""
    if name not in ENGINES_UNDER_TEST:
        raise ValueError(f"engine {name!r} is not an engine under test; those are: {', '.join(ENGINES_UNDER_TEST)}")
    return import_module(f"specbench.engines.{name}_engine")


def engine_shortfall(case) -> str | None:
    """Why ``case``'s engine under test cannot run here (not installed, the wrong build for its device), or None
    (also for specbench's own engines)."""
    if case.engine not in ENGINES_UNDER_TEST:
        return None
    return engine_module(case.engine).unavailable(case.device)
