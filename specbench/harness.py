"""Run a case: plain and speculative decoding through the same engine in the same process,
per-request records, aggregate metrics with speedup, a lossless check, and the environment."""

from __future__ import annotations

import datetime as _dt
import gc
import re

import torch
from tqdm.auto import tqdm

from specbench.cases import Case
from specbench.engine.decode import Decoder, GenerationConfig
from specbench.env import environment_fingerprint
from specbench.engine.step_costs import measure_step_costs
from specbench.metrics import aggregate
from specbench.speed import measurement_flags, repeat_record, speed_over_repeats
from specbench.run_parts import (  # noqa: F401 - re-exported: callers load cases through the harness
    DTYPES, RESULT_SCHEMA_VERSION, RunResult, _request_record, build_proposer, generation_config, load_prompt_ids,
    load_target, lossless_report, parse_dtype, to_json, write_json_atomic,
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
