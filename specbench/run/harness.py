"""Run a case: plain and speculative decoding through the same engine in the same process,
per-request records, aggregate metrics with speedup, a lossless check, and the environment."""

from __future__ import annotations

import gc
import re

import torch

from specbench.run.sequence import decode_case  # noqa: F401 - re-exported
from specbench.cases import ENGINES_UNDER_TEST, Case
from specbench.run.parts import (  # noqa: F401 - re-exported: callers load cases through the harness
    DTYPES, RESULT_SCHEMA_VERSION, RunResult, _request_record, build_proposer, generation_config, load_prompt_ids,
    load_target, lossless_report, parse_dtype, to_json, write_json_atomic,
)


# a RuntimeError with one of these in its message is a device fault, not a bug of the case
_DEVICE_FAULT = re.compile(r"CUDA error|CUDA out of memory|CUBLAS|cuDNN", re.IGNORECASE)
_REQUESTED = re.compile(r"Tried to allocate (\d+(?:\.\d+)? ?[KMGTP]?i?B)")
_CACHE_NEEDED = re.compile(r"needs a static KV cache of (\d+ bytes)")  # static_cache.check_cache_fits


def case_fault(err: BaseException) -> dict | None:
    """``{"type", "message", "requested"}`` when ``err`` is a device fault of one case (torch.OutOfMemoryError,
    which torch.cuda.OutOfMemoryError is, a MemoryError such as a batched cache that does not fit, or a
    RuntimeError naming a CUDA, CUBLAS or cuDNN error) or a tensor-parallel case's failed rank, else None.
    ``message`` is the first line of the error (torch's OOM message names the memory it tried to allocate there);
    ``requested`` is that amount ("2.00 GiB"), or None when the message does not say."""
    from specbench.distributed import TensorParallelCaseError  # a rank that failed, or ranks that disagreed

    if not isinstance(err, (torch.OutOfMemoryError, MemoryError, TensorParallelCaseError)) and not (
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
    if case.engine in ENGINES_UNDER_TEST:  # checked against the eager engine, which this runs: docs/conformance.md
        from specbench.run.external import run_external_case

        return run_external_case(case, run_case, progress=progress, loaded=(target, proposer))
    if case.batch_size is not None or case.batch_sizes is not None:  # B slots of the static engine: docs/batching.md
        from specbench.run.batch import run_batched_case

        return run_batched_case(case, progress=progress, target=target, tokenizer=tokenizer, proposer=proposer)
    if case.tensor_parallel is not None:  # the target sharded over ranks: docs/tensor_parallel.md
        from specbench.run.tensor_parallel import run_tensor_parallel_case

        if target is not None or proposer is not None:
            raise ValueError(f"case {case.case_id}: tensor_parallel = {case.tensor_parallel} loads its target and "
                             "proposer on every rank; it cannot take ones loaded in this process")
        return run_tensor_parallel_case(case, progress=progress)
    if target is None:
        target, tokenizer = load_target(case)
    if proposer is None:
        proposer = build_proposer(case, target)
    return decode_case(case, target, tokenizer, proposer, progress=progress)
