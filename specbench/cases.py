"""Case definitions: target x proposer x prompt set x sampling x dtype/device x max tokens.

Cases are plain dicts or TOML tables (``[[case]]`` entries of ``specbench/cases/<suite>.toml``);
the CLI and the pytest suites read the same files.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import asdict, dataclass, field, fields
from importlib import resources
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_TARGET = "specbench-tiny/random-llama"
CASES_PACKAGE_DIR = "cases"


@dataclass
class Case:
    name: str
    suite: str = "adhoc"
    target: str = DEFAULT_TARGET
    # {"name": "ngram" | "medusa" | "none" | ..., **options passed to the proposer}
    proposer: dict = field(default_factory=lambda: {"name": "ngram", "num_speculative_tokens": 3})
    # {"name": prompt set or JSONL path | "synthetic", "num_prompts": N, "n_shot": 1, "chat_template": false}
    prompts: dict = field(default_factory=lambda: {"name": "synthetic", "num_prompts": 8})
    # SamplingParams fields: temperature, top_p, acceptance, typical_epsilon, typical_delta
    sampling: dict = field(default_factory=dict)
    dtype: str = "float32"
    device: str = "cpu"
    max_new_tokens: int = 64
    seed: int = 0
    ignore_eos: bool = False
    # per-metric gate tolerance overrides, e.g. {"acceptance_rate": 0.03}
    tolerances: dict = field(default_factory=dict)
    # quality metrics of random-weight targets mean nothing: set false to report but never gate them
    gate_quality: bool = True
    # None: gate speed on GPUs only (CPU timings on shared machines are noise); true/false forces it
    gate_speed: bool | None = None
    # gate quality against this case's (same suite) quality baseline instead of its own: a CUDA fp32
    # twin of a CPU case must reproduce the CPU acceptance; the two may differ only in name and device
    quality_baseline: str | None = None
    # GPU memory the case needs (GiB); the pytest plugin skips below it
    min_gpu_gib: float | None = None

    @property
    def case_id(self) -> str:
        return f"{self.suite}/{self.name}"

    @classmethod
    def from_dict(cls, data: dict, *, origin: str = "case") -> "Case":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{origin}: unknown case key(s) {unknown}; known keys: {sorted(known)}")
        if "name" not in data:
            raise ValueError(f"{origin}: a case needs a 'name'")
        if not isinstance(data.get("proposer", {}), dict) or "name" not in data.get("proposer", {"name": 1}):
            raise ValueError(f"{origin}: 'proposer' must be a table with a 'name' key, got {data.get('proposer')!r}")
        if not isinstance(data.get("prompts", {}), dict) or "name" not in data.get("prompts", {"name": 1}):
            raise ValueError(f"{origin}: 'prompts' must be a table with a 'name' key, got {data.get('prompts')!r}")
        return cls(**data)

    def to_dict(self) -> dict:
        return asdict(self)


def builtin_suites() -> list[str]:
    root = resources.files("specbench").joinpath(CASES_PACKAGE_DIR)
    return sorted(p.name[: -len(".toml")] for p in root.iterdir() if p.name.endswith(".toml"))


def load_suite(spec: str) -> list[Case]:
    """Cases of a built-in suite name or of a TOML file path."""
    if spec in builtin_suites():
        resource = resources.files("specbench").joinpath(CASES_PACKAGE_DIR, f"{spec}.toml")
        text, origin, default_suite = resource.read_text(encoding="utf-8"), f"specbench/cases/{spec}.toml", spec
    elif spec.endswith(".toml") and Path(spec).is_file():
        text, origin, default_suite = Path(spec).read_text(encoding="utf-8"), spec, Path(spec).stem
    else:
        raise ValueError(f"unknown suite {spec!r}; built-in suites: {', '.join(builtin_suites())}, or a path to a .toml case file")
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{origin}: invalid TOML: {err}") from err
    entries = table.get("case")
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{origin}: expected one or more [[case]] tables")
    suite = table.get("suite", default_suite)
    cases = [Case.from_dict({"suite": suite, **entry}, origin=f"{origin} case {i}") for i, entry in enumerate(entries)]
    names = [c.name for c in cases]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"{origin}: case names must be unique within a suite; repeated: {duplicates}")
    return cases


def find_case(spec: str) -> list[Case]:
    """``SUITE``, ``SUITE/CASE`` or a TOML path -> the cases it names."""
    if "/" in spec and not spec.endswith(".toml"):
        suite, _, name = spec.partition("/")
        matches = [c for c in load_suite(suite) if c.name == name]
        if not matches:
            raise ValueError(f"suite {suite!r} has no case {name!r}; its cases: {[c.name for c in load_suite(suite)]}")
        return matches
    return load_suite(spec)


_UNSET_VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")


def expand_ref(ref: str, *, key: str = "target") -> str:
    """Expand ``${VAR}`` in a model or checkpoint reference; an unset variable is a clear error."""
    expanded = os.path.expandvars(ref)
    leftover = _UNSET_VARIABLE.search(expanded)
    if leftover:
        raise ValueError(
            f"case {key} {ref!r} uses the environment variable {leftover.group(1)}, which is not set; set it "
            f"(e.g. for SPECBENCH_SYNTH_DIR run `specbench zoo synth DIR` and export SPECBENCH_SYNTH_DIR=DIR)"
        )
    return expanded


def unmet_requirements(case: Case) -> str | None:
    """Why this machine cannot run ``case`` (no CUDA, too little GPU memory), or None."""
    if not case.device.startswith("cuda") and not case.min_gpu_gib:
        return None
    from specbench import env

    shortfall = env.gpu_shortfall(case.min_gpu_gib or 0.0, env.gpu_inventory())
    return f"{case.case_id} (device={case.device!r}): {shortfall}" if shortfall else None
