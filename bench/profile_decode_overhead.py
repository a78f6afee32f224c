"""Where a batch-1 decode step's wall time goes outside the target's forward, single-sequence against batched B = 1.

Both static engines run the same prompt plainly and with the oracle (its own greedy continuation, K draft
tokens: full acceptance). Per engine and kind this measures: the verify call alone (``measure_step_costs``'s
T(1) and T(K+1), device synchronised around each, median of ``--reps``), the decode loop's wall time per
step (median of ``--repeats`` requests, the two engines alternating), their difference (the loop's work
outside the verify: proposing, verification, commit, bookkeeping) and, from torch.profiler over one
request, what the host launched per step (kernels, copies, graph replays, synchronisations) and its top
host ops: the whole request's counts, its prefill and first token included, divided by its steps. Writes OUT_DIR/decode_overhead.json atomically and prints a table.

    python bench/profile_decode_overhead.py OUT_DIR --synth-dir SYNTH_DIR [--k 3] [--new-tokens 128]
    python bench/profile_decode_overhead.py OUT_DIR --tiny --device cpu --new-tokens 16     # CPU smoke test
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench_target import add_target_arguments, load_target  # noqa: E402
from batch_curve import ScriptedBatch  # noqa: E402

from specbench.io.atomic_write import write_text_atomic  # noqa: E402
from specbench.engine.batched_decode import BatchedDecoder  # noqa: E402
from specbench.engine.batched_target import BatchedStaticTarget  # noqa: E402
from specbench.engine.decode import Decoder, GenerationConfig  # noqa: E402
from specbench.engine.step_costs import measure_batched_step_costs, measure_step_costs  # noqa: E402
from specbench.env import environment_fingerprint  # noqa: E402
from specbench.proposers.scripted import ScriptedProposer  # noqa: E402

KINDS = ("plain", "oracle")
# runtime calls counted per step (their names in torch.profiler's CPU events)
RUNTIME_CALLS = ("cudaLaunchKernel", "cudaMemcpyAsync", "cudaGraphLaunch", "cudaStreamSynchronize",
                 "cudaMemsetAsync", "cudaEventSynchronize", "cudaDeviceSynchronize")


class Engine:
    """One engine's decode of one request (``kind`` plain or oracle) and its verify-only step costs."""

    def __init__(self, name: str, static, prompt: torch.Tensor, truth: list[int], k: int, config: GenerationConfig):
        self.name, self.static, self.prompt, self.truth, self.k, self.config = name, static, prompt, truth, k, config
        if name == "batched":
            self.target = BatchedStaticTarget.from_static_target(static, 1)
            self.target.reserve(prompt.numel() + config.max_new_tokens + k, k)
        else:
            self.target = static

    def proposer(self, kind: str):
        """The oracle for this engine (batched or one sequence's); None for plain."""
        if kind == "plain":
            return None
        if self.name == "batched":
            return ScriptedBatch({tuple(self.prompt.tolist()): self.truth}, self.k, self.static.vocab_size)
        return ScriptedProposer(self.truth, self.k, self.static.vocab_size)

    def decode(self, kind: str) -> tuple[float, int]:
        """(seconds of the decode steps, their count) of one request, first token left out."""
        if self.name == "batched":
            decoder = BatchedDecoder(self.target, self.proposer(kind), self.config)
            decoder.generate_all([self.prompt])
            return decoder.stats.step_s, decoder.stats.num_steps
        result = Decoder(self.target, self.proposer(kind), self.config).generate(self.prompt)
        return result.timing.total_s - result.timing.time_to_first_token_s, result.counters.num_target_forwards

    def verify_ms(self, kind: str, reps: int) -> float:
        """The verify call of the kind's step alone (T(1) or T(K+1)), ms."""
        if self.name == "batched":
            costs = measure_batched_step_costs(self.target, self.proposer(kind), [self.prompt], reps=reps)
        else:
            costs = measure_step_costs(self.target, self.proposer(kind), self.prompt, reps=reps)
        return (costs.t1_s if kind == "plain" else costs.verify_s) * 1e3


def profiled_request(engine: Engine, kind: str) -> dict:
    """Runtime calls per step and the top host ops of one request under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if engine.static.device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        _, steps = engine.decode(kind)
    calls = Counter()
    host_ops = Counter()
    for event in prof.events():
        if event.name in RUNTIME_CALLS:
            calls[event.name] += 1
        elif event.name.startswith("aten::") and event.cpu_parent is None:  # top-level ops the loop called
            host_ops[event.name] += 1
    return {"steps": steps,
            "runtime_calls_per_step": {name: n / steps for name, n in sorted(calls.items())},
            "top_level_aten_ops_per_step": {name: n / steps for name, n in host_ops.most_common(20)}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    add_target_arguments(parser)
    parser.add_argument("--k", type=int, default=3, help="oracle draft tokens per step")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5, help="timed requests per engine and kind (alternating)")
    parser.add_argument("--reps", type=int, default=20, help="timed verify calls per step cost")
    args = parser.parse_args(argv)
    if args.k < 1 or args.new_tokens < 2 or args.repeats < 1 or args.reps < 1:
        parser.error("--k and --repeats and --reps must be >= 1, --new-tokens >= 2")
    static, dtype = load_target(args)
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, static.vocab_size, (args.prompt_len,), generator=generator)  # (T,)
    config = GenerationConfig(max_new_tokens=args.new_tokens, ignore_eos=True)
    static.reserve(args.prompt_len + args.new_tokens + args.k, args.k)
    truth = Decoder(static, None, GenerationConfig(max_new_tokens=args.new_tokens + args.k + 1, ignore_eos=True)
                    ).generate(prompt).output_token_ids
    engines = [Engine(name, static, prompt, truth, args.k, config) for name in ("single_sequence", "batched")]
    report = {"schema_version": 1, "env": environment_fingerprint(device=str(static.device), dtype=dtype),
              "settings": {"dtype": dtype, "k": args.k, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
                           "repeats": args.repeats, "reps": args.reps}, "engines": {}}
    for kind in KINDS:
        for engine in engines:
            engine.decode(kind)  # warm: graphs captured, allocator grown
        walls = {engine.name: [] for engine in engines}
        for _ in range(args.repeats):
            for engine in engines:  # alternating, so both see the same machine
                seconds, steps = engine.decode(kind)
                walls[engine.name].append(seconds / steps * 1e3)
        for engine in engines:
            step_ms = statistics.median(walls[engine.name])
            verify_ms = engine.verify_ms(kind, args.reps)
            report["engines"].setdefault(engine.name, {})[kind] = {
                "step_wall_ms": step_ms, "verify_ms": verify_ms, "outside_verify_ms": step_ms - verify_ms,
                **profiled_request(engine, kind)}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out_dir / "decode_overhead.json", json.dumps(report, indent=1))
    print(f"{'engine':16} {'kind':7} {'step ms':>8} {'verify ms':>9} {'outside':>8} | runtime calls per step")
    for name, kinds in report["engines"].items():
        for kind, f in kinds.items():
            calls = "  ".join(f"{c.removeprefix('cuda')} {n:.1f}" for c, n in f["runtime_calls_per_step"].items())
            print(f"{name:16} {kind:7} {f['step_wall_ms']:8.3f} {f['verify_ms']:9.3f} {f['outside_verify_ms']:8.3f} | {calls}")
            print("      ops per step: " + "  ".join(f"{op.removeprefix('aten::')} {n:.1f}"
                                                   for op, n in list(f["top_level_aten_ops_per_step"].items())[:12]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
