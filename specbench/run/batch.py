"""Run a case at a batch size in the static engine's B slots, group results into batch-size curves, and sweep K x B."""

from __future__ import annotations

import datetime as _dt
import math
import time

import torch
from tqdm.auto import tqdm

from specbench.cases import OVERRIDABLE, SWEEPABLE, Case, with_overrides
from specbench.engine.decode import Decoder, GenerationConfig
from specbench.engine.static_target import StaticTarget
from specbench.engine.proposer import for_batch
from specbench.run.step_costs import measure_step_costs
from specbench.run import kernel_choices
from specbench.env import environment_fingerprint
from specbench.gating.curves import curve_name
from specbench.metrics import aggregate
from specbench.run.parts import (RunResult, _request_record, build_proposer, generation_config, load_prompt_ids,
                                 load_target, lossless_report)
from specbench.compile_watch import TimedWindow, capture_seconds
from specbench.run.speed import measurement_flags, repeat_record, speed_over_repeats

SWEEP_SCHEMA_VERSION = 1
# what a repeat record of a batched run adds to repeat_record's; each becomes the median metric of the run
BATCH_REPEAT_METRICS = ("throughput_tokens_per_s", "plain_throughput_tokens_per_s", "batch_speedup")


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _peak_memory(device: torch.device) -> int | None:
    """Bytes the CUDA allocator held at most since the last reset; None on other devices."""
    return int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None


def batched_target_for(case: Case, target=None, tokenizer=None):
    """(StaticTarget of ``case.batch_size`` slots, the one-slot StaticTarget whose weights it shares, tokenizer)."""
    if target is None:
        target, tokenizer = load_target(case)
    if not isinstance(target, StaticTarget):
        raise ValueError(f"case {case.case_id}: batch_size needs the static engine's StaticTarget, got "
                         f"{type(target).__name__}; set engine = \"static\"")
    return target.with_batch_size(case.batch_size), target, tokenizer


def batched_form(case: Case, static: StaticTarget, proposer, batch_size: int):
    """``proposer`` (built for ``static``) for ``batch_size`` slots, None for plain decoding: a slot proposer (Medusa,
    the draft model, EAGLE) rebuilt for B, any other one per slot, built like the case's own proposer."""
    if proposer is None:
        return None
    return for_batch(proposer, batch_size, factory=lambda: build_proposer(case, static))


def _timed_run(decoder: Decoder, prompts: list, seeds: list[int], device) -> tuple[list, float]:
    """(results in prompt order, wall seconds of the whole batched run, device synchronised around it)."""
    _synchronize(device)
    start = time.perf_counter()
    results = decoder.generate_all(prompts, seeds)
    _synchronize(device)
    return results, time.perf_counter() - start


def throughput(results: list, wall_s: float) -> float:
    """Output tokens of every request / wall seconds of the run that decoded them together."""
    return sum(r.timing.num_output_tokens for r in results) / wall_s if wall_s > 0 else math.nan


def batch_repeat_record(repeat: int, records: list[dict], spec: list, spec_s: float, plain: list, plain_s: float,
                        costs) -> dict:
    """One repeat of a batched run: repeat_record's figures, from its step costs at B (``StepCosts`` or its
    dict), plus its throughputs."""
    record = repeat_record(repeat, records, costs)
    spec_rate, plain_rate = throughput(spec, spec_s), throughput(plain, plain_s)
    record.update(throughput_tokens_per_s=spec_rate, plain_throughput_tokens_per_s=plain_rate,
                  batch_speedup=spec_rate / plain_rate if plain_rate > 0 else math.nan,
                  wall_s=spec_s, plain_wall_s=plain_s)
    return record


def batch_metrics(case: Case, spec: list, peak: int | None) -> dict:
    """The batch figures of a run beside its medians over repeats: the batch size, the mean wait for a slot, peak
    memory."""
    out: dict = {"batch_size": case.batch_size}
    out["queue_s"] = sum(r.queue_s for r in spec) / len(spec) if spec else math.nan
    out["peak_memory_bytes"] = peak
    return out


def run_batched_case(case: Case, *, progress: bool = True, target=None, tokenizer=None, proposer=None):
    """Run ``case`` at ``case.batch_size`` through the Decoder: plain batched decoding, then speculative,
    per repeat, over the whole prompt set with the same seeds, then the step costs at B; per-request records as
    run_case writes them."""
    if case.batch_sizes is not None:
        raise ValueError(f"case {case.case_id} is a batch_sizes sweep {case.batch_sizes}: run its points "
                         "(cases.expand_batch_sizes, as load_suite does)")
    target, static, tokenizer = batched_target_for(case, target, tokenizer)
    proposer = proposer if proposer is not None else build_proposer(case, static)
    if static.aux_layers != target.aux_layers:  # an EAGLE-3 proposer set them on the static target it was built for
        target.set_aux_layers(static.aux_layers)
    config = generation_config(case, tokenizer)
    prompts, prompt_source = load_prompt_ids(case, tokenizer, target.vocab_size)
    ids = [torch.as_tensor(p, dtype=torch.long) for _, p in prompts]
    seeds = [case.seed + index for index in range(len(prompts))]
    room = proposer.max_draft_tokens if proposer else 0
    # the memory check (bytes needed and free) and the cache allocation, before per-slot state or warm-up (where steps
    # are queued ahead, Decoder.prepare grows it by a second step's draft: plain and Medusa, with no per-slot state)
    target.reserve(max(p.numel() for p in ids) + case.max_new_tokens + room, room)
    batched_proposer = batched_form(case, static, proposer, case.batch_size)
    plain_decoder, spec_decoder = Decoder(target, None, config), Decoder(target, batched_proposer, config)
    # every graph the whole prompt set can replay (prefills, steps at every span, the proposer's at its full size),
    # before the warm-up, which decodes fewer prompts: nothing is captured once the clock runs
    spec_decoder.prepare(ids)

    warm = GenerationConfig(max_new_tokens=min(4, case.max_new_tokens), sampling=config.sampling, seed=case.seed)
    for proposer_now in (None, batched_proposer):  # first calls pay for allocator growth and kernel selection
        Decoder(target, proposer_now, warm).generate_all(ids[: case.batch_size])

    _reset_peak_memory(target.device)
    window = TimedWindow(target, batched_proposer)  # what the timed runs compiled or captured (none, when warm)
    records, repeats, first, peaks = [], [], None, []
    bar = tqdm(total=2 * case.repeats, desc=case.case_id, unit="run", disable=not progress)
    for repeat in range(case.repeats):
        with window.timed():
            plain, plain_s = _timed_run(plain_decoder, ids, seeds, target.device)
        bar.update()
        with window.timed():
            spec, spec_s = _timed_run(spec_decoder, ids, seeds, target.device)
        bar.update()
        peaks.append(_peak_memory(target.device))  # the timed runs' peak, not the step costs'
        # T(1), T(W) and propose at B, all slots active, on the same target between runs (docs/batching.md)
        costs = measure_step_costs(target, batched_proposer, ids)
        _reset_peak_memory(target.device)
        now = [_request_record(pid, s, p, repeat) for (pid, _), s, p in zip(prompts, spec, plain)]
        records += now
        repeats.append(batch_repeat_record(repeat, now, spec, spec_s, plain, plain_s, costs))
        first = first or (plain, spec, spec_decoder.stats)  # every repeat decodes the same tokens (same seeds)
    bar.close()
    plain, spec, stats = first

    metrics = aggregate([r.counters for r in spec], [r.timing for r in spec])
    # the medians, BATCH_REPEAT_METRICS among them; the prediction checked against the batch speedup
    metrics.update(speed_over_repeats(repeats, BATCH_REPEAT_METRICS, measured="batch_speedup"))
    peak = max((p for p in peaks if p is not None), default=None)
    metrics.update(batch_metrics(case, spec, peak))
    correctness = lossless_report([r.output_token_ids for r in plain], [r.output_token_ids for r in spec],
                                  checked=config.sampling.rule == "greedy")
    details = {
        "proposer": batched_proposer.describe() if batched_proposer else {"name": "none"}, "prompts": prompt_source,
        "engine": {"name": case.engine, "batched": True, "capture_seconds": target.capture_seconds,
                   "proposer_capture_seconds": capture_seconds(batched_proposer),
                   "cuda_graphs": target.cuda_graphs, "autotune": kernel_choices.describe(*kernel_choices.case_modules(target, batched_proposer))},
        "batch": {"batch_size": case.batch_size, "num_steps": stats.num_steps, "num_refills": stats.num_refills,
                  "mean_active_slots": (sum(stats.active_per_step) / len(stats.active_per_step)
                                        if stats.active_per_step else math.nan)},
    }
    created_at = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    env = environment_fingerprint(device=case.device, dtype=case.dtype)
    return RunResult(case, metrics, records, correctness, env, details, created_at, repeats,
                     measurement_flags(metrics, measured="batch_speedup") + window.flags())


# ---- curves: results that differ only in batch size --------------------------------------------------------

# verify_cost_ratio: T(W)/T(1) at B, whose growth with B is why speculation stops paying at large batch
CURVE_FIELDS = ("throughput_tokens_per_s", "plain_throughput_tokens_per_s", "batch_speedup", "acceptance_rate",
                "mean_acceptance_length", "verify_cost_ratio", "predicted_speedup")


def _curve_key(result: dict) -> str:
    """What the results of one curve share: their case definition without its name and batch size."""
    from specbench.io import strict_json

    case = {k: v for k, v in (result.get("case") or {}).items() if k not in ("name", "batch_size")}
    return strict_json.dumps(case)


def curves(results: list[dict]) -> list[dict]:
    """``[{"case_id", "points": [{"batch_size", *CURVE_FIELDS}]}]``, one per group of batched results that differ
    only in batch size (two points at least), points by batch size; error entries and unbatched results are left out."""
    groups: dict[str, list[dict]] = {}
    for result in results:
        if "error" in result or (result.get("metrics") or {}).get("batch_size") is None:
            continue
        groups.setdefault(_curve_key(result), []).append(result)
    out = []
    for members in groups.values():
        if len(members) < 2:
            continue
        points = sorted(({"batch_size": r["metrics"]["batch_size"], **{f: r["metrics"].get(f) for f in CURVE_FIELDS}}
                         for r in members), key=lambda p: p["batch_size"])
        out.append({"case_id": curve_name(members[0]["case_id"]), "points": points})
    return out


# ---- sweep: one case over K x B ----------------------------------------------------------------------------


def grid_cases(case: Case, batch_sizes: list[int], draft_lengths: list[int | None], overrides: dict | None = None) -> list[Case]:
    """``case`` with ``overrides`` (OVERRIDABLE run settings) at every (K, B), K outer, each renamed after all its
    changes at once; a K of None keeps the case's own proposer."""
    overrides = {key: value for key, value in (overrides or {}).items() if key not in SWEEPABLE}
    allowed = tuple(dict.fromkeys((*OVERRIDABLE, *SWEEPABLE)))
    return [with_overrides(case, {**overrides, "num_speculative_tokens": k, "batch_size": b}, allowed=allowed)[0]
            for k in draft_lengths for b in batch_sizes]


def sweep_point(case: Case, result: dict) -> dict:
    """One grid point of a sweep's JSON: its K, B, case id, and its metrics (or its error)."""
    point = {"num_speculative_tokens": case.proposer.get("num_speculative_tokens"), "batch_size": case.batch_size,
             "case_id": case.case_id}
    if "error" in result:
        return {**point, "error": result["error"]}
    return {**point, "metrics": result["metrics"], "correctness": {k: result["correctness"][k] for k in ("checked", "exact", "match_fraction")}}


def best_per_batch_size(points: list[dict]) -> list[dict]:
    """Per batch size, the K of highest throughput among the points that ran (ties: the smaller K)."""
    best: dict[int, dict] = {}
    for point in points:
        rate = (point.get("metrics") or {}).get("throughput_tokens_per_s")
        if rate is None or not math.isfinite(rate):
            continue
        held = best.get(point["batch_size"])
        if held is None or rate > held["throughput_tokens_per_s"]:
            best[point["batch_size"]] = {"batch_size": point["batch_size"], "num_speculative_tokens":
                                         point["num_speculative_tokens"], "throughput_tokens_per_s": rate,
                                         "batch_speedup": point["metrics"].get("batch_speedup")}
    return [best[b] for b in sorted(best)]


def sweep_report(case: Case, batch_sizes: list[int], draft_lengths: list, points: list[dict], env: dict) -> dict:
    """The sweep's JSON: the grid's axes, every point, and the best K per batch size."""
    return {"schema": SWEEP_SCHEMA_VERSION, "case_id": case.case_id, "case": case.to_dict(),
            "batch_sizes": batch_sizes, "num_speculative_tokens": draft_lengths, "points": points,
            "best": best_per_batch_size(points), "env": env}
