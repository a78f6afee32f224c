"""Proposer registry: built-ins register by decorator; third parties through the
``specbench.proposers`` entry-point group (``name = "package.module:ProposerClass"``)."""

from __future__ import annotations

import inspect
from importlib import import_module
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from specbench.engine.proposer import Proposer, SlotProposer

if TYPE_CHECKING:
    from specbench.engine.target import Target

ENTRY_POINT_GROUP = "specbench.proposers"
# built-in proposers, imported lazily so that loading one never pulls in another's dependencies
_BUILTIN_MODULES = {"ngram": "specbench.proposers.ngram", "medusa": "specbench.proposers.medusa",
                    "draft": "specbench.proposers.draft_model", "eagle": "specbench.proposers.eagle",
                    "eagle3": "specbench.proposers.eagle3"}
_REGISTRY: dict[str, type[Proposer | SlotProposer]] = {}


def register_proposer(cls: type[Proposer | SlotProposer]) -> type[Proposer | SlotProposer]:
    """Class decorator: make ``cls`` (a per-sequence :class:`Proposer`, or a :class:`SlotProposer` built for its
    target's batch size: a ``name`` and ``from_options``) available under ``cls.name``."""
    if not isinstance(getattr(cls, "name", None), str) or not cls.name:
        raise TypeError(f"{cls.__qualname__} must set a non-empty class attribute `name`")
    existing = _REGISTRY.get(cls.name)
    if existing is not None and existing is not cls:
        raise ValueError(f"proposer name {cls.name!r} is already taken by {existing.__module__}.{existing.__qualname__}")
    _REGISTRY[cls.name] = cls
    return cls


def _entry_point_names() -> dict:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_proposers() -> list[str]:
    """Names accepted by :func:`create_proposer`, built-in and installed."""
    return sorted(set(_BUILTIN_MODULES) | set(_REGISTRY) | set(_entry_point_names()))


def get_proposer_class(name: str) -> type[Proposer | SlotProposer]:
    if name in _REGISTRY:
        return _REGISTRY[name]
    if name in _BUILTIN_MODULES:
        import_module(_BUILTIN_MODULES[name])
        return _REGISTRY[name]
    eps = _entry_point_names()
    if name in eps:
        cls = eps[name].load()
        if not (isinstance(cls, type) and issubclass(cls, (Proposer, SlotProposer))):
            raise TypeError(
                f"entry point {name!r} in group {ENTRY_POINT_GROUP!r} ({eps[name].value}) must name a "
                f"specbench.proposers.Proposer subclass (per sequence) or SlotProposer subclass (per batch of slots), got {cls!r}"
            )
        _REGISTRY.setdefault(name, cls)
        return cls
    raise ValueError(
        f"unknown proposer {name!r}; available: {', '.join(available_proposers())}. Third-party proposers "
        f"register under the entry-point group {ENTRY_POINT_GROUP!r}."
    )


class ProposerOptionsError(ValueError):
    """A proposer given options it does not take (a case file's proposer table, most likely)."""


def create_proposer(name: str, target: "Target", **options) -> Proposer | SlotProposer:
    """Build the proposer called ``name`` for ``target`` with its options (a slot proposer for its batch size)."""
    cls = get_proposer_class(name)
    parameters = inspect.signature(cls.from_options).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    known = [p for p in parameters if p != "target" and parameters[p].kind is not inspect.Parameter.VAR_KEYWORD]
    unknown = sorted(set(options) - set(known))
    if unknown and not takes_any:
        raise ProposerOptionsError(
            f"proposer {name!r} does not take option(s) {', '.join(map(repr, unknown))}; "
            f"it takes: {', '.join(known) or 'no options'}"
        )
    return cls.from_options(target, **options)
