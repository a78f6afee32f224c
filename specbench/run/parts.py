"""What running a case is made of: its target, proposer, prompts and generation settings loaded from the case,
one request's record, the lossless check and the run's result (used by the one-request, batched and tensor-parallel runners)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specbench.io import strict_json
from specbench.io.atomic_write import write_text_atomic
from specbench.cases.requirements import expand_ref
from specbench.cases import DTYPE_NAMES, Case, case_source
from specbench.checkpoints.tiny import BUILTIN_TARGETS
from specbench.engine.decode import GenerationConfig, GenerationResult
from specbench.engine.hf_target import HFTarget
from specbench.engine.sampling import SamplingParams
from specbench.run import kernel_choices
from specbench.engine.static_target import StaticTarget
from specbench.metrics import common_prefix
from specbench.prompts import load_prompts, synthetic_prompts
from specbench.proposers import create_proposer
from specbench.proposers.registry import ProposerOptionsError

RESULT_SCHEMA_VERSION = 2  # 2: requests carry their repeat; repeats and flags added
DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}  # the names cases.py validates, as torch dtypes


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


def load_target(case: Case, *, static_class: type[StaticTarget] = StaticTarget, device: str | None = None):
    """(target, tokenizer or None) for the case's target reference, on the case's engine: HFTarget
    (eager) or ``static_class`` (static: StaticTarget, the Llama family, refused naming the model_type
    otherwise; tensor-parallel runs pass its sharded subclass and their rank's ``device``)."""
    dtype = parse_dtype(case.dtype)
    device = device or case.device
    if case.engine == "static" and str(device).startswith("cuda"):
        kernel_choices.install()  # the kernels autotuning picks for the one-row matmuls go into the result's details
    if case.target in BUILTIN_TARGETS:
        model = BUILTIN_TARGETS[case.target](dtype).to(device)
        return (static_class.from_hf_model(model) if case.engine == "static" else HFTarget(model)), None
    from specbench.checkpoints.resolve import load_target_model, resolve_model_dir

    reference = expand_ref(case.target)
    if case.engine == "static":
        target = static_class.from_pretrained(reference, dtype=dtype, device=device)
    else:
        target = HFTarget(load_target_model(reference, dtype=dtype, device=device))
    return target, load_tokenizer(resolve_model_dir(reference))


def load_tokenizer(directory: Path):
    """The tokenizer stored in a model directory, or None when it has none."""
    if not any((directory / name).exists() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)


def load_prompt_ids(case: Case, tokenizer, vocab_size: int) -> tuple[list[tuple[str, list[int]]], dict]:
    """(prompt id, token ids) pairs and a record of where the prompts came from."""
    spec = dict(case.prompts)
    name = spec.pop("name")
    num_prompts = spec.pop("num_prompts", None)
    if name == "synthetic":
        seed = spec.pop("seed", 0)
        prompts = synthetic_prompts(num_prompts or 8, vocab_size=vocab_size, seed=seed)
        source = {"name": name, "source": "synthetic", "origin": f"specbench.prompts.synthetic seed {seed}", "notes": []}
        return [(f"synthetic-{i}", ids) for i, ids in enumerate(prompts)], source
    prompt_set = load_prompts(
        name,
        num_prompts=num_prompts,
        n_shot=spec.pop("n_shot", 1),
        tokenizer=tokenizer,
        chat_template=spec.pop("chat_template", False),
    )
    if spec:
        raise ValueError(f"case {case.case_id}: unknown prompts option(s) {sorted(spec)}; known: name, num_prompts, n_shot, chat_template, seed")
    missing = [p.id for p in prompt_set if p.token_ids is None]
    if missing:
        raise ValueError(
            f"case {case.case_id}: target {case.target!r} has no tokenizer, so the text prompts of {name!r} "
            f"(e.g. {missing[0]!r}) cannot be tokenised; use prompts = {{name = \"synthetic\"}} or a JSONL "
            "file of prompt_token_ids"
        )
    source = {"name": prompt_set.name, "source": prompt_set.source, "origin": prompt_set.origin, "notes": list(prompt_set.notes)}
    return [(p.id, p.token_ids) for p in prompt_set], source


def lossless_report(plain: list[list[int]], spec: list[list[int]], checked: bool) -> dict:
    """Compare speculative with plain outputs. match_fraction = tokens before the first divergence
    / plain output tokens, pooled over requests (1.0 = identical)."""
    first_divergence = []
    matched = 0
    for p, s in zip(plain, spec):
        prefix = common_prefix(p, s)
        matched += prefix
        first_divergence.append(None if p == s else prefix)
    total = sum(len(p) for p in plain)
    return {
        "checked": checked,
        "exact": all(d is None for d in first_divergence),
        "match_fraction": matched / total if total else 1.0,
        "first_divergence": first_divergence,
    }


@dataclass
class RunResult:
    case: Case
    metrics: dict
    requests: list[dict]
    correctness: dict
    env: dict
    details: dict  # what the proposer and the prompt set resolved to (settings, source, fallbacks)
    created_at: str
    repeats: list[dict] = field(default_factory=list)  # per repeat: its speed figures and step costs
    flags: list[dict] = field(default_factory=list)  # measurement problems: {"kind", "message"}

    def to_dict(self) -> dict:
        return {
            "schema": RESULT_SCHEMA_VERSION,
            "case": self.case.to_dict(),
            "case_id": self.case.case_id,
            "metrics": self.metrics,
            "requests": self.requests,
            "correctness": self.correctness,
            "env": self.env,
            "details": self.details,
            "created_at": self.created_at,
            "repeats": self.repeats,
            "flags": self.flags,
        }


def to_json(result: dict, *, indent: int | None = 2) -> str:
    """Strict JSON (NaN becomes null, as the result schema says); ``indent=None`` gives one line."""
    return strict_json.dumps(result, indent=indent)


def write_json_atomic(path: str | os.PathLike, text: str) -> None:
    """Write a result file atomically, creating its directory."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, text + "\n")


def _request_record(prompt_id: str, spec: GenerationResult, plain: GenerationResult, repeat: int = 0) -> dict:
    counters = spec.counters
    return {
        "prompt_id": prompt_id,
        "repeat": repeat,
        "output_token_ids": spec.output_token_ids,
        "plain_output_token_ids": plain.output_token_ids,
        "num_drafts": counters.num_drafts,
        "num_draft_tokens": counters.num_draft_tokens,
        "num_accepted_tokens": counters.num_accepted_tokens,
        "accepted_per_position": counters.accepted_per_position,
        "acceptance_rate": counters.acceptance_rate,
        "mean_acceptance_length": counters.mean_acceptance_length,
        "tokens_per_s": spec.timing.tokens_per_s,
        "plain_tokens_per_s": plain.timing.tokens_per_s,
        "time_to_first_token_s": spec.timing.time_to_first_token_s,
        "per_token_latency_s": spec.timing.per_token_latency_s,
        "plain_per_token_latency_s": plain.timing.per_token_latency_s,
        "finish_reason": spec.finish_reason,
    }


def build_proposer(case: Case, target):
    """The case's proposer for ``target`` (None for ``name = "none"``: plain decoding only)."""
    options = dict(case.proposer)
    name = options.pop("name")
    if "path" in options:
        options["path"] = expand_ref(options["path"], key="proposer.path")
    if name == "none":
        return None
    try:
        return create_proposer(name, target, **options)
    except ProposerOptionsError as err:  # found only now (the registry loads the proposer), said as a case-file error
        source = case_source(case)
        where = f"{source}: case {case.name!r}" if source else f"case {case.case_id}"
        raise ValueError(f"{where}: {err}; remove the option from the case's proposer table") from None


def generation_config(case: Case, tokenizer) -> GenerationConfig:
    eos = ()
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        eos = (int(tokenizer.eos_token_id),)
    return GenerationConfig(
        max_new_tokens=case.max_new_tokens,
        sampling=SamplingParams(**case.sampling),
        ignore_eos=case.ignore_eos,
        eos_token_ids=eos,
        seed=case.seed,
    )
