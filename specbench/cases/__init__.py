"""Case definitions: target x proposer x prompt set x sampling x dtype/device x max tokens.

Cases are plain dicts or TOML tables (``[[case]]`` entries of ``specbench/cases/<suite>.toml``);
the CLI and the pytest suites read the same files. The legal values of the fields a command line can set
(VALUE_RULES) are stated once here, for case files and for ``specbench run`` / ``calibrate-tree`` flags alike
(specbench.cli.arguments);
:func:`with_overrides` applies a command line's changes to a stored case and renames it after them. What a case
needs from the machine that runs it is specbench/cases/requirements.py.
"""

from __future__ import annotations

import math
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
DTYPE_NAMES = ("float32", "bfloat16", "float16")  # harness.DTYPES, named here without importing torch
# eager: HFTarget over any transformers causal LM (the reference); static: StaticTarget, the Llama family on a
# preallocated cache with one CUDA graph per verify width (the fast path; docs/engines.md); then the engines under
# test, each checked against eager (vllm: docs/conformance.md)
ENGINES_UNDER_TEST = ("vllm",)  # each implemented by specbench/engines/<name>_engine.py
ENGINE_NAMES = ("eager", "static", *ENGINES_UNDER_TEST)
DEFAULT_N_SHOT = 1  # what harness.load_prompt_ids uses when a gsm8k case leaves n_shot out
# a 32-bit seed, as numpy takes: prompt i runs with seed + i, which stays far from torch's signed 64-bit limit
MAX_SEED = 2**32 - 1
MAX_REPEATS = 100  # repeats of a case's whole prompt set in one run (the speed gates take their median)
BATCHED_ENGINE = "static"  # the engine the batched decode loop runs on (docs/batching.md)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# field -> (test, what is expected): the one statement of the legal values, in case files and on the command line
VALUE_RULES = {
    "name": (lambda v: isinstance(v, str) and bool(v.strip()) and "/" not in v, "a non-empty string without '/'"),
    "max_new_tokens": (lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    "num_prompts": (lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    "n_shot": (lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
    "num_speculative_tokens": (lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    "seed": (lambda v: _is_int(v) and 0 <= v <= MAX_SEED, "an integer from 0 to 2**32 - 1"),
    "temperature": (lambda v: _is_number(v) and v >= 0, "a number >= 0 (0 = greedy)"),
    "dtype": (lambda v: v in DTYPE_NAMES, f"one of {', '.join(DTYPE_NAMES)}"),
    "device": (lambda v: isinstance(v, str) and bool(v), "a torch device name such as cpu, cuda or cuda:1"),
    "ignore_eos": (lambda v: isinstance(v, bool), "true or false"),
    "engine": (lambda v: v in ENGINE_NAMES, f"one of {', '.join(ENGINE_NAMES)}"),
    "repeats": (lambda v: _is_int(v) and 1 <= v <= MAX_REPEATS, f"an integer from 1 to {MAX_REPEATS}"),
    "batch_size": (lambda v: _is_int(v) and v >= 1, "an integer >= 1 (requests decoded together)"),
    "batch_sizes": (lambda v: isinstance(v, list) and bool(v) and all(_is_int(b) and b >= 1 for b in v)
                    and len(set(v)) == len(v), "a non-empty list of distinct integers >= 1, e.g. [1, 2, 4, 8]"),
    "tensor_parallel": (lambda v: _is_int(v) and v >= 1, "an integer >= 1 (ranks the target is sharded over)"),
    "gate_speed": (lambda v: v is None or isinstance(v, bool) or v == "ratios",
                   'true, false or "ratios" (same-run ratios only: for launch-bound cases)'),
}
# where each rule's field lives in a case: top level, or inside its prompts / sampling / proposer table
_NESTED_FIELDS = {"num_prompts": "prompts", "n_shot": "prompts", "temperature": "sampling",
                  "num_speculative_tokens": "proposer"}


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
    engine: str = "eager"  # ENGINE_NAMES: which Target runs the case
    seed: int = 0
    ignore_eos: bool = False
    # the prompt set is decoded this many times (plain and speculative alternating per prompt); speed is
    # gated on the median over repeats, with an interval over requests and repeats (docs/metrics.md)
    repeats: int = 1
    # per-metric gate tolerance overrides, e.g. {"acceptance_rate": 0.03}
    tolerances: dict = field(default_factory=dict)
    # quality metrics of random-weight targets mean nothing: set false to report but never gate them
    gate_quality: bool = True
    # None: gate speed on GPUs only (CPU timings on shared machines are noise); true/false forces it;
    # "ratios": gate only the same-run ratios (speedup, step costs), for cases whose absolute timings follow the host
    gate_speed: bool | str | None = None
    # gate quality against this case's (same suite) quality baseline instead of its own: a CUDA fp32
    # twin of a CPU case must reproduce the CPU acceptance; the two may differ only in name and device
    quality_baseline: str | None = None
    # GPU memory the case needs (GiB); the pytest plugin skips below it
    min_gpu_gib: float | None = None
    # requests decoded together by the static engine's B slots (engine = "static"); unset: one request at a time
    batch_size: int | None = None
    # a sweep over batch sizes: load_suite expands the case into one case per size, NAME[batch_size=B]
    batch_sizes: list[int] | None = None
    # ranks the static engine's target is sharded over (docs/tensor_parallel.md); unset: one process, as before
    tensor_parallel: int | None = None

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
        if not isinstance(data.get("sampling", {}), dict):
            raise ValueError(f"{origin}: 'sampling' must be a table (e.g. {{ temperature = 0.7 }}), "
                             f"got {data['sampling']!r}")
        _check_values(data, origin)
        _check_batching(data, origin)
        _check_tensor_parallel(data, origin)
        return cls(**data)

    def to_dict(self) -> dict:
        """The case's fields; keys added later than the stored baselines are left out while unset, so a case
        that does not use them keeps the definition (and result) it always had."""
        data = asdict(self)
        return {key: value for key, value in data.items() if key not in UNSET_OMITTED or value is not None}


# fields written by Case.to_dict only when set (None: the behaviour from before they existed)
UNSET_OMITTED = ("batch_size", "batch_sizes", "tensor_parallel")
TENSOR_PARALLEL_ENGINE = "static"  # the engine whose target engine/tensor_parallel.py shards


def _check_tensor_parallel(data: dict, origin: str) -> None:
    """tensor_parallel > 1 shards the static engine's target, one request at a time (not batched, for now)."""
    size = data.get("tensor_parallel")
    if size is None or size == 1:
        return
    origin = f"{origin} (case {data.get('name')!r})"
    if data.get("engine", "eager") != TENSOR_PARALLEL_ENGINE:
        raise ValueError(f"{origin}: tensor_parallel = {size} shards the static engine's target, and the case has "
                         f"engine = {data.get('engine', 'eager')!r}; set engine = \"{TENSOR_PARALLEL_ENGINE}\" "
                         f"(--engine {TENSOR_PARALLEL_ENGINE}) or drop tensor_parallel")
    batched = [key for key in ("batch_size", "batch_sizes") if data.get(key) is not None]
    if batched:
        raise ValueError(f"{origin}: tensor_parallel = {size} cannot be combined with {batched[0]} = "
                         f"{data[batched[0]]!r} yet (the batched engine is not sharded); drop one of them")


def _check_batching(data: dict, origin: str) -> None:
    """batch_size and batch_sizes exclude each other and need the static engine (``engine = "static"``)."""
    if data.get("batch_size") is not None and data.get("batch_sizes") is not None:
        raise ValueError(f"{origin}: set batch_size (one size) or batch_sizes (a sweep), not both; found "
                         f"batch_size = {data['batch_size']!r} and batch_sizes = {data['batch_sizes']!r}")
    key = "batch_size" if data.get("batch_size") is not None else "batch_sizes"
    if data.get(key) is not None and data.get("engine", "eager") != BATCHED_ENGINE:
        raise ValueError(f"{origin}: {key} = {data[key]!r} runs the batched engine, which needs "
                         f"engine = \"{BATCHED_ENGINE}\", and the case has engine = {data.get('engine', 'eager')!r}; "
                         f"set engine = \"{BATCHED_ENGINE}\" (--engine {BATCHED_ENGINE}) or drop {key}")


def expand_batch_sizes(case: "Case") -> list["Case"]:
    """A batch_sizes case as one case per size, ``NAME[batch_size=B]`` in the list's order; any other case alone."""
    if case.batch_sizes is None:
        return [case]
    points = []
    for size in case.batch_sizes:
        data = {**case.to_dict(), "batch_size": size}
        del data["batch_sizes"]
        data["name"] = changed_name(case.name, {"batch_size": size})
        points.append(Case.from_dict(data, origin=f"{case.case_id} at batch_size {size}"))
    return points


def _check_value(key: str, value, origin: str, label: str | None = None) -> None:
    test, expected = VALUE_RULES[key]
    if not test(value):
        raise ValueError(f"{origin}: {label or key} must be {expected}, found {value!r}")


def _check_values(data: dict, origin: str) -> None:
    """Each VALUE_RULES field the case sets holds a legal value, else a ValueError naming it."""
    for key in VALUE_RULES:
        table = _NESTED_FIELDS.get(key)
        where = (data.get(table) or {}) if table else data
        if key in where and not (key in UNSET_OMITTED and where[key] is None):
            _check_value(key, where[key], origin, f"{table}.{key}" if table else key)


# the run settings `specbench run` can change on a stored case, in the order a changed case's name lists them
OVERRIDABLE = ("max_new_tokens", "num_prompts", "n_shot", "temperature", "seed", "ignore_eos", "dtype", "device",
               "engine", "batch_size", "tensor_parallel")
# what `specbench sweep` varies besides: the draft length of a chain proposer
SWEEPABLE = ("num_speculative_tokens", "batch_size")
_NAMING_ORDER = (*OVERRIDABLE, "num_speculative_tokens")


def run_settings(case: "Case") -> dict:
    """The OVERRIDABLE settings of ``case`` as a run applies them (a field the case leaves out at its default)."""
    return {
        "max_new_tokens": case.max_new_tokens, "num_prompts": case.prompts.get("num_prompts"),
        "n_shot": case.prompts.get("n_shot", DEFAULT_N_SHOT), "temperature": case.sampling.get("temperature", 0.0),
        "seed": case.seed, "ignore_eos": case.ignore_eos, "dtype": case.dtype, "device": case.device,
        "engine": case.engine, "batch_size": case.batch_size, "tensor_parallel": case.tensor_parallel,
        "num_speculative_tokens": case.proposer.get("num_speculative_tokens"),
    }


def _shown(value) -> str:
    """A setting as a changed case's name shows it: TOML's true/false, floats without trailing zeros."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:g}" if isinstance(value, float) else str(value)


def changed_name(name: str, changed: dict) -> str:
    """The name of a case changed by ``changed``: ``chain-k3[max_new_tokens=8,num_prompts=2]``."""
    return f"{name}[{','.join(f'{key}={_shown(value)}' for key, value in changed.items())}]"


def _check_chain_length(case: "Case", overrides: dict) -> None:
    """num_speculative_tokens changes a chain proposer's K only: not a tree, nor plain decoding."""
    if overrides.get("num_speculative_tokens") is None:
        return
    if case.proposer.get("name") == "none" or "tree" in case.proposer:
        what = "decodes plainly" if case.proposer.get("name") == "none" else f"drafts the tree {case.proposer['tree']!r}"
        raise ValueError(f"num_speculative_tokens sets the length of a draft chain, and case {case.case_id} {what}; "
                         "drop the num_speculative_tokens setting (--num-speculative-tokens) or pick a chain case")


def with_overrides(case: "Case", overrides: dict, *, allowed: tuple[str, ...] = OVERRIDABLE) -> tuple["Case", dict]:
    """(``case`` with ``overrides`` applied, the settings that changed); ``overrides`` maps OVERRIDABLE names to
    values, None meaning "not given". A value equal to the case's own changes nothing.

    A changed case is renamed after its changes, ``chain-k3[max_new_tokens=8,num_prompts=2]``: its case id is
    not the stored case's, so it is never gated against, stored as, or plotted with the stored case's baseline
    and history. It also loses ``quality_baseline`` (a twin's quality baseline is no more its own), and
    ``min_gpu_gib`` when it leaves CUDA.
    """
    unknown = sorted(set(overrides) - set(allowed))
    if unknown:
        raise ValueError(f"cannot override {unknown} of a case; overridable: {', '.join(allowed)}")
    if case.batch_sizes is not None:
        raise ValueError(f"case {case.case_id} is a batch_sizes sweep {case.batch_sizes}: override one of its points "
                         f"(expand_batch_sizes, as load_suite does), e.g. {changed_name(case.name, {'batch_size': case.batch_sizes[0]})}")
    given = {key: value for key, value in overrides.items() if value is not None}
    for key, value in given.items():
        _check_value(key, value, f"override of {case.case_id}")
    if "n_shot" in given and case.prompts.get("name") != "gsm8k":
        raise ValueError(f"n_shot applies to the gsm8k prompt set only, and case {case.case_id} uses "
                         f"{case.prompts.get('name')!r}; drop the n_shot override (--n-shot)")
    _check_chain_length(case, given)
    current = run_settings(case)
    changed = {key: given[key] for key in _NAMING_ORDER if key in given and given[key] != current[key]}
    if not changed:
        return case, {}
    data = case.to_dict()  # asdict copies the nested tables
    for key, value in changed.items():
        table = _NESTED_FIELDS.get(key)
        (data[table] if table else data)[key] = value
    data["name"] = changed_name(case.name, changed)
    data["quality_baseline"] = None
    if not data["device"].startswith("cuda"):
        data["min_gpu_gib"] = None
    return Case.from_dict(data, origin=f"{case.case_id} with overrides"), changed


def builtin_suites() -> list[str]:
    root = resources.files("specbench").joinpath(CASES_PACKAGE_DIR)
    return sorted(p.name[: -len(".toml")] for p in root.iterdir() if p.name.endswith(".toml"))


_SOURCES: dict[str, str] = {}  # case id -> the file load_suite read it from, for errors found after loading


def case_source(case: Case) -> str | None:
    """The case file ``case`` (or the stored case it was derived from: NAME[...]) was loaded from, if any."""
    return _SOURCES.get(case.case_id) or _SOURCES.get(case.case_id.split("[", 1)[0])


def load_suite(spec: str) -> list[Case]:
    """Cases of a built-in suite name or of a TOML file path."""
    if spec in builtin_suites():
        resource = resources.files("specbench").joinpath(CASES_PACKAGE_DIR, f"{spec}.toml")
        text, origin, default_suite = resource.read_text(encoding="utf-8"), f"specbench/cases/{spec}.toml", spec
    elif spec.endswith(".toml") and Path(spec).is_file():
        try:
            text, origin, default_suite = Path(spec).read_text(encoding="utf-8"), spec, Path(spec).stem
        except UnicodeDecodeError as err:
            raise ValueError(f"{spec}: not UTF-8 text ({err.reason} at byte {err.start}); "
                             "TOML files must be UTF-8") from None
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
    cases = [point for i, entry in enumerate(entries)
             for point in expand_batch_sizes(Case.from_dict({"suite": suite, **entry}, origin=f"{origin} case {i}"))]
    names = [c.name for c in cases]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"{origin}: case names must be unique within a suite; repeated: {duplicates}")
    _SOURCES.update({case.case_id: origin for case in cases})
    return cases


def find_case(spec: str) -> list[Case]:
    """``SUITE``, ``SUITE/CASE`` or a TOML path -> the cases it names."""
    if "/" in spec and not spec.endswith(".toml"):
        suite, _, name = spec.partition("/")
        # a batch_sizes case is named by its points, NAME[batch_size=B]: its own name selects them all
        matches = [c for c in load_suite(suite) if c.name == name] or [
            c for c in load_suite(suite) if c.name.startswith(f"{name}[batch_size=")]
        if not matches:
            raise ValueError(f"suite {suite!r} has no case {name!r}; its cases: {[c.name for c in load_suite(suite)]}")
        return matches
    return load_suite(spec)
