"""Run a case: plain and speculative decoding through the same engine in the same process,
per-request records, aggregate metrics with speedup, a lossless check, and the environment."""

from __future__ import annotations

import datetime as _dt
import gc
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from specbench import strict_json
from specbench.atomic_write import write_text_atomic
from specbench.cases import DTYPE_NAMES, Case, expand_ref
from specbench.checkpoints.tiny import BUILTIN_TARGETS
from specbench.engine.decode import Decoder, GenerationConfig, GenerationResult
from specbench.engine.hf_target import HFTarget
from specbench.engine.sampling import SamplingParams
from specbench.engine.static_target import StaticTarget
from specbench.env import environment_fingerprint
from specbench.engine.step_costs import measure_step_costs
from specbench.metrics import aggregate
from specbench.speed import measurement_flags, repeat_record, speed_over_repeats
from specbench.prompts import load_prompts, synthetic_prompts
from specbench.proposers import create_proposer

RESULT_SCHEMA_VERSION = 2  # 2: requests carry their repeat; repeats and flags added
DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}  # the names cases.py validates, as torch dtypes


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


def load_target(case: Case):
    """(target, tokenizer or None) for the case's target reference, on the case's engine: HFTarget
    (eager) or StaticTarget (static; the Llama family, refused naming the model_type otherwise)."""
    dtype = parse_dtype(case.dtype)
    if case.target in BUILTIN_TARGETS:
        model = BUILTIN_TARGETS[case.target](dtype).to(case.device)
        return (StaticTarget.from_hf_model(model) if case.engine == "static" else HFTarget(model)), None
    from specbench.checkpoints.resolve import load_target_model, resolve_model_dir

    reference = expand_ref(case.target)
    if case.engine == "static":
        target = StaticTarget.from_pretrained(reference, dtype=dtype, device=case.device)
    else:
        target = HFTarget(load_target_model(reference, dtype=dtype, device=case.device))
    directory = resolve_model_dir(reference)
    tokenizer = None
    if any((directory / name).exists() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(directory)
    return target, tokenizer


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


def _common_prefix(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def lossless_report(plain: list[list[int]], spec: list[list[int]], checked: bool) -> dict:
    """Compare speculative with plain outputs. match_fraction = tokens before the first divergence
    / plain output tokens, pooled over requests (1.0 = identical)."""
    first_divergence = []
    matched = 0
    for p, s in zip(plain, spec):
        prefix = _common_prefix(p, s)
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
    return None if name == "none" else create_proposer(name, target, **options)


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


# a RuntimeError with one of these in its message is a device fault, not a bug of the case
_DEVICE_FAULT = re.compile(r"CUDA error|CUDA out of memory|CUBLAS|cuDNN", re.IGNORECASE)
_REQUESTED = re.compile(r"Tried to allocate (\d+(?:\.\d+)? ?[KMGTP]?i?B)")
_CACHE_NEEDED = re.compile(r"needs a static KV cache of (\d+ bytes)")  # batched_cache.check_cache_fits


def case_fault(err: BaseException) -> dict | None:
    """``{"type", "message", "requested"}`` when ``err`` is a device fault of one case (torch.OutOfMemoryError,
    which torch.cuda.OutOfMemoryError is, a MemoryError such as a batched cache that does not fit, or a
    RuntimeError naming a CUDA, CUBLAS or cuDNN error), else None.
    ``message`` is the first line of the error (torch's OOM message names the memory it tried to allocate there);
    ``requested`` is that amount ("2.00 GiB"), or None when the message does not say."""
    if not isinstance(err, (torch.OutOfMemoryError, MemoryError)) and not (
            isinstance(err, RuntimeError) and _DEVICE_FAULT.search(str(err))):
        return None
    message = (str(err).strip().splitlines() or [""])[0]
    requested = _REQUESTED.search(str(err)) or _CACHE_NEEDED.search(str(err))
    return {"type": type(err).__name__, "message": message, "requested": requested.group(1) if requested else None}


def fault_line(case_id: str, fault: dict) -> str:
    """The one line a faulted case is reported by: ``<case_id>: ERROR <Type>: <first line of the message>``."""
    return f"{case_id}: ERROR {fault['type']}" + (f": {fault['message']}" if fault["message"] else "")


def free_device_memory() -> None:
    """After a faulted case: collect what it left behind and give the CUDA caching allocator's blocks back."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_case(case: Case, *, progress: bool = True, target=None, tokenizer=None, proposer=None) -> RunResult:
    """Run ``case`` (plain, then speculative, per prompt, alternating so drift hits both alike). ``target``
    and ``proposer`` replace the ones the case would load (benchmarks wrap them to inject slowdowns)."""
    if case.batch_size is not None or case.batch_sizes is not None:  # the batched engine: docs/batching.md
        from specbench.batch_run import run_batched_case

        return run_batched_case(case, progress=progress, target=target, tokenizer=tokenizer, proposer=proposer)
    if target is None:
        target, tokenizer = load_target(case)
    if proposer is None:
        proposer = build_proposer(case, target)
    config = generation_config(case, tokenizer)
    sampling = config.sampling
    plain_decoder = Decoder(target, None, config)
    spec_decoder = Decoder(target, proposer, config)
    prompts, prompt_source = load_prompt_ids(case, tokenizer, target.vocab_size)
    # the longest request's cache before the warm-up: a static target that grew mid-run would allocate
    # and capture its graphs inside a timed request
    room = proposer.max_draft_tokens if proposer else 0
    target.reserve(max(len(ids) for _, ids in prompts) + case.max_new_tokens + room, room)
    if proposer is not None:
        proposer.reserve(max(len(ids) for _, ids in prompts) + case.max_new_tokens + room)

    # warm-up: first calls pay for allocator growth and kernel selection; keep them out of timings
    warm = GenerationConfig(max_new_tokens=min(4, case.max_new_tokens), sampling=sampling, seed=case.seed)
    Decoder(target, None, warm).generate(prompts[0][1])
    Decoder(target, proposer, warm).generate(prompts[0][1])

    plain_results, spec_results, records, repeats = [], [], [], []
    for repeat in range(case.repeats):
        label = case.case_id if case.repeats == 1 else f"{case.case_id} [{repeat + 1}/{case.repeats}]"
        plain_now, spec_now = [], []
        for index, (prompt_id, ids) in enumerate(tqdm(prompts, desc=label, unit="prompt", disable=not progress)):
            plain = plain_decoder.generate(ids, seed=case.seed + index)
            spec = spec_decoder.generate(ids, seed=case.seed + index)
            plain_now.append(plain)
            spec_now.append(spec)
            records.append(_request_record(prompt_id, spec, plain, repeat))
        costs = measure_step_costs(target, proposer, prompts[0][1])
        repeats.append(repeat_record(repeat, records[-len(prompts):], costs))
        if repeat == 0:  # every repeat decodes the same tokens (same seeds): counters come from the first
            plain_results, spec_results = plain_now, spec_now

    metrics = aggregate([r.counters for r in spec_results], [r.timing for r in spec_results])
    metrics.update(speed_over_repeats(repeats))
    # only greedy verification promises identical outputs; sampled runs differ legitimately
    correctness = lossless_report(
        [r.output_token_ids for r in plain_results], [r.output_token_ids for r in spec_results], checked=sampling.rule == "greedy"
    )
    env = environment_fingerprint(device=case.device, dtype=case.dtype)
    details = {"proposer": proposer.describe() if proposer else {"name": "none"}, "prompts": prompt_source,
               "engine": {"name": case.engine, "capture_seconds": getattr(target, "capture_seconds", 0.0)}}
    created_at = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return RunResult(case, metrics, records, correctness, env, details, created_at, repeats, measurement_flags(metrics))
