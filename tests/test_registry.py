"""Proposer registry: built-ins by name, third parties through the entry-point group."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

from specbench.proposers import registry
from specbench.engine.proposer import Proposer, SlotProposer


class ThirdPartyProposer(Proposer):
    name = "third-party"

    @classmethod
    def from_options(cls, target, **options):
        instance = cls()
        instance.options = options
        return instance

    @property
    def max_draft_tokens(self) -> int:
        return 1

    def propose(self, state):
        return None


class ThirdPartySlotProposer(SlotProposer):
    """A proposer in slot form: a ``name`` and ``from_options``, built for the target's batch size."""

    name = "third-party"

    @classmethod
    def from_options(cls, target, **options):
        return cls()

    @property
    def max_draft_tokens(self) -> int:
        return 1

    def propose(self, states):
        return {slot: None for slot in states}


def fake_entry_points(value: str):
    def entry_points(group):
        assert group == "specbench.proposers"
        return [EntryPoint(name="third-party", value=value, group=group)]

    return entry_points


def test_entry_point_discovery(monkeypatch):
    monkeypatch.setattr(registry, "entry_points", fake_entry_points(f"{__name__}:ThirdPartyProposer"))
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    assert "third-party" in registry.available_proposers()
    proposer = registry.create_proposer("third-party", target=None, k=2)
    assert isinstance(proposer, ThirdPartyProposer) and proposer.options == {"k": 2}


def test_entry_point_may_name_a_slot_proposer(monkeypatch):
    monkeypatch.setattr(registry, "entry_points", fake_entry_points(f"{__name__}:ThirdPartySlotProposer"))
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    assert isinstance(registry.create_proposer("third-party", target=None), ThirdPartySlotProposer)
    for name in ("medusa", "draft", "eagle", "eagle3"):  # the built-ins with one form for every batch size
        assert issubclass(registry.get_proposer_class(name), SlotProposer), name


def test_entry_point_must_name_a_proposer(monkeypatch):
    monkeypatch.setattr(registry, "entry_points", fake_entry_points("math:pi"))
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    with pytest.raises(TypeError, match=r"entry point 'third-party'.*math:pi.*Proposer subclass"):
        registry.get_proposer_class("third-party")


def test_name_clash_is_refused(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    registry.get_proposer_class("ngram")

    class Impostor(ThirdPartyProposer):
        name = "ngram"

    with pytest.raises(ValueError, match="already taken"):
        registry.register_proposer(Impostor)
