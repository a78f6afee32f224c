"""The case loop of one request at a time, on a loaded target and proposer: warm-up, plain and speculative
decoding per prompt (alternating, so drift hits both alike), repeats, step costs after each, and the run's result
(the harness runs it in process; every rank of a tensor-parallel run runs it alike)."""

from __future__ import annotations

import datetime as _dt

import torch

from tqdm.auto import tqdm

from specbench.cases import Case
from specbench.engine.decode import Decoder, GenerationConfig
from specbench.run.step_costs import measure_step_costs
from specbench.run import kernel_choices
from specbench.env import environment_fingerprint
from specbench.metrics import aggregate
from specbench.run.parts import RunResult, _request_record, generation_config, load_prompt_ids, lossless_report
from specbench.compile_watch import TimedWindow, capture_seconds
from specbench.run.speed import measurement_flags, repeat_record, speed_over_repeats


def decode_case(case: Case, target, tokenizer, proposer, *, progress: bool = True) -> RunResult:
    """The case loop of :func:`run_case` on a loaded ``target`` and ``proposer`` (every rank of a
    tensor-parallel run runs it alike)."""
    config = generation_config(case, tokenizer)
    sampling = config.sampling
    plain_decoder = Decoder(target, None, config)
    spec_decoder = Decoder(target, proposer, config)
    prompts, prompt_source = load_prompt_ids(case, tokenizer, target.vocab_size)
    # the longest request's cache and every graph the prompt set replays, before the warm-up: a static target that
    # grew or captured mid-run would do it inside a timed request
    spec_decoder.prepare([torch.as_tensor(ids, dtype=torch.long) for _, ids in prompts])

    # warm-up: first calls pay for allocator growth and kernel selection; keep them out of timings
    warm = GenerationConfig(max_new_tokens=min(4, case.max_new_tokens), sampling=sampling, seed=case.seed)
    Decoder(target, None, warm).generate(prompts[0][1])
    Decoder(target, proposer, warm).generate(prompts[0][1])

    window = TimedWindow(target, proposer)  # what the timed requests compiled or captured (none, when warm)
    plain_results, spec_results, records, repeats = [], [], [], []
    for repeat in range(case.repeats):
        label = case.case_id if case.repeats == 1 else f"{case.case_id} [{repeat + 1}/{case.repeats}]"
        plain_now, spec_now = [], []
        for index, (prompt_id, ids) in enumerate(tqdm(prompts, desc=label, unit="prompt", disable=not progress)):
            with window.timed():
                plain = plain_decoder.generate(ids, seed=case.seed + index)
                spec = spec_decoder.generate(ids, seed=case.seed + index)
            plain_now.append(plain)
            spec_now.append(spec)
            records.append(_request_record(prompt_id, spec, plain, repeat))
        costs = measure_step_costs(target, spec_decoder.proposer, [prompts[0][1]])
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
               "engine": {"name": case.engine, "capture_seconds": capture_seconds(target),
                          "proposer_capture_seconds": capture_seconds(proposer)}}
    if case.engine == "static":
        details["engine"]["autotune"] = kernel_choices.describe(*kernel_choices.case_modules(target, proposer))
    created_at = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return RunResult(case, metrics, records, correctness, env, details, created_at, repeats,
                     measurement_flags(metrics) + window.flags())
