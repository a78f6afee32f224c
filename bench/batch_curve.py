"""Batch-size curve of the static engine: plain and speculative throughput at B = 1..32 on the synthetic 7B."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench_target import add_target_arguments, load_target  # noqa: E402
from _phase_clock import sync  # noqa: E402
from speed_7b import MEDUSA_PROFILE  # noqa: E402
from specbench.io.atomic_write import write_text_atomic  # noqa: E402
from specbench.cli.arguments import list_argument_type  # noqa: E402
from specbench.compile_watch import TimedWindow  # noqa: E402
from specbench.engine.decode import Decoder, GenerationConfig  # noqa: E402
from specbench.engine.proposer import SlotProposer  # noqa: E402
from specbench.engine.static_target import StaticTarget  # noqa: E402
from specbench.env import environment_fingerprint  # noqa: E402
from specbench.metrics import SpecCounters  # noqa: E402
from specbench.proposers.scripted import ScriptedProposer  # noqa: E402

DESCRIPTION = """Batch-size curve of the static engine: plain and speculative throughput at B = 1..32 on the synthetic 7B.

For each batch size B (``--batch-sizes``) the same prompt pool's first ``B x --rounds`` prompts are decoded
through ``Decoder`` at B slots (static engine, CUDA graphs per (kind, width, span), bf16 on CUDA): plainly, with
the oracle (the target's own greedy continuation, K draft tokens: full acceptance) and with the Medusa-7B
acceptance profile (the oracle wrong at random per position, Medusa-1's published per-head top-1 on Vicuna-7B;
bench/speed_7b.py). Per B: throughput (output tokens / wall seconds of the run), decode throughput (the tokens of
the verify steps / their wall time: admissions, i.e. group prefills, left out, and their seconds beside it),
per-request time per output token, TTFT (from admission, and from the run's start), speedup vs plain at the same
B, acceptance rate and MAL, the CUDA allocator's peak. Also: the plain throughput ratios largest B / B = 1 (whole
run and decode phase), and per proposer the crossover B (the first at which it no longer beats plain). Graph
capture, compilation and warm-up runs are never timed. Writes OUT_DIR/batch_curve.json atomically and prints a
table.

    python bench/batch_curve.py OUT_DIR --synth-dir SYNTH_DIR          # a GPU box: `specbench zoo synth SYNTH_DIR` first
    python bench/batch_curve.py OUT_DIR --tiny --device cpu --batch-sizes 1,2 --new-tokens 8   # CPU smoke test
"""
SCHEMA_VERSION = 2  # 2: one engine, so no single_sequence_batch_1 figures nor batch_1_*_over_single_sequence ratios
RUNS = ("plain", "oracle", "medusa_profile")


class ScriptedBatch(SlotProposer):
    """The oracle of bench/speed_7b.py for B slots: each slot drafts its current request's known continuation
    (``truths[prompt]``) through its own ``ScriptedProposer``, optionally wrong at random per position."""

    def __init__(self, truths: dict[tuple, list[int]], k: int, vocab_size: int, position_accuracy=None):
        self.truths, self.k, self.vocab_size, self.position_accuracy = truths, k, vocab_size, position_accuracy
        self.slots: dict[int, ScriptedProposer] = {}

    @property
    def max_draft_tokens(self) -> int:
        return self.k

    def begin_request(self, slot: int, prompt_ids: torch.Tensor) -> None:
        key = tuple(prompt_ids.tolist())  # once per admission, not per step
        seed = list(self.truths).index(key)  # each request its own random stream, whatever slot it lands in
        self.slots[slot] = ScriptedProposer(self.truths[key], self.k, self.vocab_size,
                                            position_accuracy=self.position_accuracy, seed=seed)
        self.slots[slot].begin_request(prompt_ids)

    def propose(self, states):
        return {slot: self.slots[slot].propose(state) for slot, state in states.items()}


def _finite(x):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def summarize(results: list, wall_s: float, stats) -> dict:
    """The figures of one run of requests; ``stats`` (the run's RunStats) gives its decode phase apart from its
    admissions."""
    tokens = sum(r.timing.num_output_tokens for r in results)
    counters = SpecCounters()
    for r in results:
        counters = counters.merge(r.counters)
    latencies = [r.timing.per_token_latency_s for r in results if not math.isnan(r.timing.per_token_latency_s)]
    return {
        "num_requests": len(results), "num_output_tokens": tokens, "wall_s": wall_s,
        "throughput_tokens_per_s": tokens / wall_s if wall_s > 0 else None,
        "time_per_output_token_s": _finite(statistics.fmean(latencies)) if latencies else None,
        "ttft_s": statistics.fmean(r.timing.time_to_first_token_s for r in results),
        "ttft_from_start_s": statistics.fmean(r.queue_s + r.timing.time_to_first_token_s for r in results),
        "acceptance_rate": _finite(counters.acceptance_rate),
        "mean_acceptance_length": _finite(counters.mean_acceptance_length),
        "num_drafts": counters.num_drafts,
        "decode_throughput_tokens_per_s": _finite(stats.decode_throughput_tokens_per_s),
        "admission_s": stats.admission_s,
        "decode_s": stats.step_s,
    }


def timed(device, run) -> tuple[list, float, int | None]:
    """(results, wall seconds, CUDA peak bytes) of ``run()``, synchronised around it."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    sync(device)
    start = time.perf_counter()
    results = run()
    sync(device)
    wall = time.perf_counter() - start
    return results, wall, int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None


def proposers(kind: str, truths: dict, k: int, vocab: int):
    """The slot proposer of a run kind (None: plain)."""
    if kind == "plain":
        return None
    return ScriptedBatch(truths, k, vocab, position_accuracy=MEDUSA_PROFILE if kind == "medusa_profile" else None)


def measure_batch(static: StaticTarget, batch: int, prompts: list, truths: dict, args, config) -> dict:
    """One point of the curve: each run kind through ``Decoder`` at ``batch`` slots, the median of ``--repeats``
    timed runs."""
    target = static.with_batch_size(batch, fused_prefill=args.fused_prefill)  # the weights shared
    # the full cache and the chain width first: a cache that grew after the warm-up would re-capture while timed
    target.reserve(max(p.numel() for p in prompts) + config.max_new_tokens + args.k, args.k)
    figures: dict = {"batch_size": batch}
    for kind in RUNS:
        make = lambda: proposers(kind, truths, args.k, static.vocab_size)  # noqa: E731
        decoder = Decoder(target, make(), config)
        decoder.prepare(prompts)  # every graph these prompts replay, never captured while timed
        warm = GenerationConfig(max_new_tokens=min(4, config.max_new_tokens), ignore_eos=True)
        Decoder(target, make(), warm).generate_all(prompts[:batch])  # allocator growth, kernel selection
        window = TimedWindow(target)
        runs = []
        for _ in range(args.repeats):
            with window.timed():
                runs.append(timed(static.device, lambda: (decoder.generate_all(prompts), decoder.stats)))
        (results, stats), wall, peak = sorted(runs, key=lambda r: r[1])[len(runs) // 2]  # the median run by wall time
        figures[kind] = {**summarize(results, wall, stats), "peak_memory_bytes": peak,
                         "mean_active_slots": statistics.fmean(stats.active_per_step), **watched(window)}
        if kind != "plain":
            plain = figures["plain"]["throughput_tokens_per_s"]
            figures[kind]["speedup_vs_plain"] = figures[kind]["throughput_tokens_per_s"] / plain if plain else None
    figures["capture_seconds"] = target.capture_seconds
    figures["cuda_graphs"] = target.cuda_graphs
    return figures


def watched(window: TimedWindow) -> dict:
    """What the timed runs compiled (torch.compile graphs) and captured (seconds of CUDA graphs): 0 when warm."""
    return {"compiled_while_timed": window.compiled, "captured_while_timed_s": window.captured}


def crossover(curve: list[dict], kind: str) -> int | None:
    """The first batch size at which ``kind`` no longer beats plain at the same B (None: it beats it everywhere)."""
    for point in curve:
        speedup = point[kind].get("speedup_vs_plain")
        if speedup is not None and speedup <= 1.0:
            return point["batch_size"]
    return None


def table(report: dict) -> str:
    lines = [f"{'B':>3} {'run':15} {'tok/s':>10} {'decode':>10} {'ms/token':>9} {'TTFT ms':>8} {'speedup':>8} {'accept':>7} {'MAL':>5} "
             f"{'peak GiB':>9}"]
    for point in report["curve"]:
        for kind in RUNS:
            f = point[kind]
            cells = [f"{point['batch_size']:>3}", f"{kind:15}", _num(f["throughput_tokens_per_s"], 10, 1),
                     _num(f["decode_throughput_tokens_per_s"], 10, 1),
                     _num(f["time_per_output_token_s"], 9, 2, 1e3), _num(f["ttft_s"], 8, 1, 1e3),
                     _num(f.get("speedup_vs_plain"), 8, 2), _num(f["acceptance_rate"], 7, 2),
                     _num(f["mean_acceptance_length"], 5, 2), _num(f["peak_memory_bytes"], 9, 2, 2.0**-30)]
            lines.append(" ".join(cells))
    for key, value in report["summary"].items():
        lines.append(f"{key}: {value}")
    return "\n".join(lines)


def _num(value, width: int, digits: int, scale: float = 1.0) -> str:
    return f"{'n/a':>{width}}" if value is None else f"{value * scale:{width}.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", help="where batch_curve.json is written (atomically)")
    add_target_arguments(parser)
    parser.add_argument("--batch-sizes", type=list_argument_type("batch_size"), default="1,2,4,8,16,32",
                        help="comma-separated distinct batch sizes >= 1 (default 1,2,4,8,16,32), run smallest first")
    parser.add_argument("--rounds", type=int, default=2, help="requests per slot: B x rounds prompts at batch size B")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128, help="max_new_tokens of every request (EOS ignored)")
    parser.add_argument("-k", "--k", type=int, default=3, help="draft tokens per step of the oracle and the profile")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs per point; the median by wall time is kept")
    parser.add_argument("--fused-prefill", action="store_true",
                        help="admissions through the fused group prefill (StaticTarget(fused_prefill=True))")
    args = parser.parse_args(argv)
    args.batch_sizes = sorted(args.batch_sizes)
    if args.rounds < 1 or args.repeats < 1 or args.k < 1 or args.new_tokens < 2 or args.prompt_len < 1:
        parser.error("--rounds, --repeats, -k and --prompt-len must be >= 1 and --new-tokens >= 2")

    device = torch.device(args.device)
    static, dtype = load_target(args)
    vocab = static.vocab_size
    pool_size = max(args.batch_sizes) * args.rounds
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, vocab, (args.prompt_len,), generator=generator) for _ in range(pool_size)]
    config = GenerationConfig(max_new_tokens=args.new_tokens, ignore_eos=True)
    # the oracle's script: each prompt's greedy continuation, K + 1 tokens beyond max_new_tokens (a step's draft is
    # never shortened), from plain decoding at the largest B (the same numbers every point verifies)
    scripter = static.with_batch_size(max(args.batch_sizes))
    script = GenerationConfig(max_new_tokens=args.new_tokens + args.k + 1, ignore_eos=True)
    outputs = Decoder(scripter, None, script).generate_all(prompts)
    truths = {tuple(p.tolist()): r.output_token_ids for p, r in zip(prompts, outputs)}
    del scripter

    report: dict = {"schema_version": SCHEMA_VERSION, "env": environment_fingerprint(device=str(device), dtype=dtype),
                    "settings": {"model": "tiny-random" if args.tiny else str(args.synth_dir), "dtype": dtype,
                                 "batch_sizes": args.batch_sizes, "rounds": args.rounds, "prompt_len": args.prompt_len,
                                 "new_tokens": args.new_tokens, "k": args.k, "repeats": args.repeats,
                                 "fused_prefill": args.fused_prefill,
                                 "medusa_profile": list(MEDUSA_PROFILE)},
                    "curve": []}
    for batch in args.batch_sizes:
        report["curve"].append(measure_batch(static, batch, prompts[: batch * args.rounds], truths, args, config))
        print(f"-- B={batch} done", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    report["summary"] = summary(report)
    report["table"] = table(report)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "batch_curve.json", json.dumps(report, indent=2, default=str, allow_nan=False) + "\n")
    print(report["table"])
    return 0


def summary(report: dict) -> dict:
    """The curve's comparisons: plain largest B / B = 1 (whole run and decode phase), and the crossovers."""
    points = {p["batch_size"]: p for p in report["curve"]}
    out: dict = {}
    if 1 in points:
        largest = max(points)
        for name in ("throughput_tokens_per_s", "decode_throughput_tokens_per_s"):
            low, high = points[1]["plain"][name], points[largest]["plain"][name]
            label = "throughput" if name == "throughput_tokens_per_s" else "decode_throughput"
            out[f"plain_{label}_b{largest}_over_b1"] = high / low if low and high else None
    for kind in ("oracle", "medusa_profile"):
        out[f"crossover_batch_size_{kind}"] = crossover(report["curve"], kind)
    return out


if __name__ == "__main__":
    sys.exit(main())
