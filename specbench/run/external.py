"""Run a case on an engine under test: its prompts as token ids, the engine's plain and speculative runs, specbench's
reference engine on the same case in the same job, and one result shaped as any engine's (requests, metrics,
lossless check, environment) whose correctness carries the conformance verdict (docs/conformance.md)."""

from __future__ import annotations

import datetime as _dt
import json
import math
import shutil
import tempfile
from pathlib import Path

from specbench.cases import Case
from specbench.engines import engine_module
from specbench.engines.conformance import verdict
from specbench.engines.interface import EngineRun, EngineUnavailable, RequestRun
from specbench.metrics import RequestTiming, SpecCounters, aggregate
from specbench.run.speed import speed_over_repeats

REFERENCE_ENGINE = "eager"  # specbench's universal reference (docs/engines.md)


def _counters(request: RequestRun) -> SpecCounters:
    return SpecCounters(num_drafts=request.num_drafts or 0, num_draft_tokens=request.num_draft_tokens or 0,
                        num_accepted_tokens=request.num_accepted_tokens or 0,
                        accepted_per_position=list(request.accepted_per_position or []))


def _timing(request: RequestRun) -> RequestTiming:
    # the engine's API returns a request whole: no first-token time is seen from outside
    return RequestTiming(len(request.output_token_ids), math.nan, request.seconds)


def _per_token(request: RequestRun) -> float:
    return request.seconds / len(request.output_token_ids) if request.output_token_ids else math.nan


def request_record(prompt_id: str, spec: RequestRun, plain: RequestRun) -> dict:
    """One request as the result's ``requests`` holds it for any engine (run/parts.py's record, without step data)."""
    counters, timing, plain_timing = _counters(spec), _timing(spec), _timing(plain)
    return {
        "prompt_id": prompt_id, "repeat": 0,
        "output_token_ids": spec.output_token_ids, "plain_output_token_ids": plain.output_token_ids,
        "num_drafts": counters.num_drafts, "num_draft_tokens": counters.num_draft_tokens,
        "num_accepted_tokens": counters.num_accepted_tokens, "accepted_per_position": counters.accepted_per_position,
        "acceptance_rate": counters.acceptance_rate, "mean_acceptance_length": counters.mean_acceptance_length,
        "tokens_per_s": timing.tokens_per_s, "plain_tokens_per_s": plain_timing.tokens_per_s,
        "time_to_first_token_s": math.nan, "per_token_latency_s": _per_token(spec),
        "plain_per_token_latency_s": _per_token(plain), "finish_reason": spec.finish_reason,
    }


def _metrics(run: EngineRun, records: list[dict]) -> tuple[dict, list[dict]]:
    """Pooled counters and speed, as the harness computes them; the step costs an engine does not expose are NaN."""
    metrics = aggregate([_counters(r) for r in run.spec], [_timing(r) for r in run.spec])
    mean = lambda key: sum(r[key] for r in records) / len(records)  # noqa: E731
    spec_rate, plain_rate = mean("tokens_per_s"), mean("plain_tokens_per_s")
    repeat = {"repeat": 0, "tokens_per_s": spec_rate, "plain_tokens_per_s": plain_rate,
              "speedup": spec_rate / plain_rate if plain_rate > 0 else math.nan,
              "decode_speedup": mean("plain_per_token_latency_s") / mean("per_token_latency_s"),
              "per_token_latency_s": mean("per_token_latency_s")}
    metrics.update(speed_over_repeats([repeat]))
    return metrics, [repeat]


def _prompts(case: Case) -> tuple[list[tuple[str, list[int]]], dict]:
    """The case's prompts as token ids, tokenised by the target's own tokenizer, as the harness loads them."""
    from specbench.cases.requirements import expand_ref
    from specbench.checkpoints.resolve import resolve_model_dir
    from specbench.run.parts import load_prompt_ids, load_tokenizer

    directory = resolve_model_dir(expand_ref(case.target))
    vocab_size = json.loads((directory / "config.json").read_text(encoding="utf-8")).get("vocab_size", 0)
    return load_prompt_ids(case, load_tokenizer(directory), vocab_size)


def reference_case(case: Case) -> Case:
    """The same case on specbench's reference engine (same name: it is the reference of this very case)."""
    return Case.from_dict({**case.to_dict(), "engine": REFERENCE_ENGINE})


def run_external_case(case: Case, run_case, *, progress: bool = True, loaded=(None, None)):
    """``case`` on its engine under test, with the conformance verdict against specbench's reference engine, which
    ``run_case`` (the harness's) runs after it. Returns a run.parts.RunResult."""
    from specbench.env import environment_fingerprint
    from specbench.run.parts import RunResult, lossless_report

    if any(part is not None for part in loaded):
        raise ValueError(f"case {case.case_id}: engine {case.engine!r} loads the case's models itself; it cannot "
                         "take a target or proposer loaded in this process")
    module = engine_module(case.engine)
    why = module.unavailable(case.device)
    if why:
        raise EngineUnavailable(f"case {case.case_id}: engine {case.engine!r} cannot run here: {why}")
    prompts, prompt_source = _prompts(case)
    workdir = Path(tempfile.mkdtemp(prefix=f"specbench-{case.engine}-"))
    run = module.run(case, [ids for _, ids in prompts], workdir, progress)
    shutil.rmtree(workdir, ignore_errors=True)  # kept when the engine failed: its error names the log there
    reference = run_case(reference_case(case), progress=progress).to_dict()
    records = [request_record(prompt_id, spec, plain) for (prompt_id, _), spec, plain in zip(prompts, run.spec, run.plain)]
    metrics, repeats = _metrics(run, records)
    greedy = float(case.sampling.get("temperature", 0.0)) == 0.0
    correctness = lossless_report([r["plain_output_token_ids"] for r in records],
                                  [r["output_token_ids"] for r in records], checked=greedy)
    correctness["conformance"] = verdict(run, records, reference, greedy=greedy)
    env = {**environment_fingerprint(device=case.device, dtype=case.dtype), run.engine: run.version}
    translation = run.translation
    details = {"proposer": {**case.proposer, run.engine: translation.speculative_config}, "prompts": prompt_source,
               "engine": {"name": run.engine, "version": run.version, "config": run.config,
                          "translation": translation.notes, "aggregate_counters": run.aggregate,
                          "known_divergences": [d.to_dict() for d in translation.divergences]}}
    created_at = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return RunResult(case, metrics, records, correctness, env, details, created_at, repeats, [])
