"""What an engine under test hands back: the interface every external engine module implements (vLLM first) and
the records it fills, so one runner turns any engine's run into specbench's result shape (docs/conformance.md).

An engine module defines:

- ``NAME``: the case's ``engine`` value;
- ``unavailable() -> str | None``: why the engine cannot run here (not installed, no CUDA build), else None;
- ``run(case, prompts, workdir, progress) -> EngineRun``: the case's plain and speculative decoding of
  ``prompts`` (token ids), its counters and outputs; raises EngineRefused for what it cannot run faithfully.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class EngineRefused(ValueError):
    """A case (option, checkpoint, shape, device) the engine under test cannot run; the message names it."""


class EngineUnavailable(ValueError):
    """The engine under test is not installed here (or not in the build the case's device needs): the CLI says so
    in one line, as for any input it cannot run."""


@dataclass(frozen=True)
class KnownDivergence:
    """Where the engine under test does not implement specbench's rule, so its counters are reported, not gated."""

    name: str
    what: str  # what the engine does differently (what it drops)
    fix: str  # what would make the two comparable

    def to_dict(self) -> dict:
        return {"name": self.name, "what": self.what, "fix": self.fix}


@dataclass
class Translation:
    """The engine's speculative configuration for a case, with every translation it took and known divergence."""

    speculative_config: dict | None  # None: plain decoding only
    notes: list[str] = field(default_factory=list)
    divergences: list[KnownDivergence] = field(default_factory=list)


@dataclass
class RequestRun:
    """One request as the engine decoded it."""

    output_token_ids: list[int]
    finish_reason: str | None
    seconds: float  # wall time of the request alone, as the engine's API returned it
    # the engine's own per-request counters (docs/metrics.md names); None for plain decoding
    num_drafts: int | None = None
    num_draft_tokens: int | None = None
    num_accepted_tokens: int | None = None
    accepted_per_position: list[int] | None = None

    @classmethod
    def from_dict(cls, data: dict) -> "RequestRun":
        return cls(**{key: data.get(key) for key in cls.__dataclass_fields__})


@dataclass
class EngineRun:
    """The engine's plain and speculative run of a case's prompts."""

    engine: str
    version: str
    config: dict  # the engine's effective configuration, as it reported it
    plain: list[RequestRun]
    spec: list[RequestRun]
    aggregate: dict  # the engine's run-level counters (a cross-check of the per-request ones)
    translation: Translation
