"""Where a batch-1 decode step's wall time goes outside the target's forward, on the static engine at batch size 1.

The engine runs one prompt plainly and with the oracle (its own greedy continuation, K draft tokens: full
acceptance). Per kind this measures: the verify call alone (``measure_step_costs``'s T(1) and T(K+1), device
synchronised around each, median of ``--reps``), the decode loop's wall time per step (median of ``--repeats``
requests), their difference (the loop's work outside the verify: proposing, verification, commit, bookkeeping)
and, from torch.profiler over one request, what the host launched per step (kernels, copies, graph replays,
synchronisations) and its top host ops: the whole request's counts, its prefill and first token included,
divided by its steps. Writes OUT_DIR/decode_overhead.json atomically and prints a table.

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
from specbench.engine.decode import Decoder, GenerationConfig  # noqa: E402
from specbench.run.step_costs import measure_step_costs  # noqa: E402
from specbench.env import environment_fingerprint  # noqa: E402

KINDS = ("plain", "oracle")
# runtime calls counted per step (their names in torch.profiler's CPU events)
RUNTIME_CALLS = ("cudaLaunchKernel", "cudaMemcpyAsync", "cudaGraphLaunch", "cudaStreamSynchronize",
                 "cudaMemsetAsync", "cudaEventSynchronize", "cudaDeviceSynchronize")


class Request:
    """One request's decode (``kind`` plain or oracle) on a target of batch size 1, and its verify-only step costs."""

    def __init__(self, target, prompt: torch.Tensor, truth: list[int], k: int, config: GenerationConfig):
        self.target, self.prompt, self.truth, self.k, self.config = target, prompt, truth, k, config
        target.reserve(prompt.numel() + config.max_new_tokens + k, k)  # the chain width before any capture

    def proposer(self, kind: str):
        """The oracle for the one slot; None for plain."""
        if kind == "plain":
            return None
        return ScriptedBatch({tuple(self.prompt.tolist()): self.truth}, self.k, self.target.vocab_size)

    def decode(self, kind: str) -> tuple[float, int]:
        """(seconds of the decode steps, their count) of one request, first token left out."""
        decoder = Decoder(self.target, self.proposer(kind), self.config)
        decoder.generate_all([self.prompt])
        return decoder.stats.step_s, decoder.stats.num_steps

    def verify_ms(self, kind: str, reps: int) -> float:
        """The verify call of the kind's step alone (T(1) or T(K+1)), ms."""
        costs = measure_step_costs(self.target, self.proposer(kind), [self.prompt], reps=reps)
        return (costs.t1_s if kind == "plain" else costs.verify_s) * 1e3


def profiled_request(request: Request, kind: str) -> dict:
    """Runtime calls per step and the top host ops of one request under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if request.target.device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        _, steps = request.decode(kind)
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
    parser.add_argument("--repeats", type=int, default=5, help="timed requests per kind")
    parser.add_argument("--reps", type=int, default=20, help="timed verify calls per step cost")
    args = parser.parse_args(argv)
    if args.k < 1 or args.new_tokens < 2 or args.repeats < 1 or args.reps < 1:
        parser.error("--k and --repeats and --reps must be >= 1, --new-tokens >= 2")
    target, dtype = load_target(args)  # batch size 1
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, target.vocab_size, (args.prompt_len,), generator=generator)  # (T,)
    config = GenerationConfig(max_new_tokens=args.new_tokens, ignore_eos=True)
    truth = Decoder(target, None, GenerationConfig(max_new_tokens=args.new_tokens + args.k + 1, ignore_eos=True)
                    ).generate(prompt).output_token_ids
    request = Request(target, prompt, truth, args.k, config)
    # schema 2: one engine, so "kinds" replaces version 1's "engines" (single_sequence, batched)
    report = {"schema_version": 2, "env": environment_fingerprint(device=str(target.device), dtype=dtype),
              "settings": {"dtype": dtype, "k": args.k, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
                           "repeats": args.repeats, "reps": args.reps}, "kinds": {}}
    for kind in KINDS:
        request.decode(kind)  # warm: graphs captured, allocator grown
        walls = []
        for _ in range(args.repeats):
            seconds, steps = request.decode(kind)
            walls.append(seconds / steps * 1e3)
        step_ms = statistics.median(walls)
        verify_ms = request.verify_ms(kind, args.reps)
        report["kinds"][kind] = {"step_wall_ms": step_ms, "verify_ms": verify_ms,
                                 "outside_verify_ms": step_ms - verify_ms, **profiled_request(request, kind)}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out_dir / "decode_overhead.json", json.dumps(report, indent=1))
    print(f"{'kind':7} {'step ms':>8} {'verify ms':>9} {'outside':>8} | runtime calls per step")
    for kind, f in report["kinds"].items():
        calls = "  ".join(f"{c.removeprefix('cuda')} {n:.1f}" for c, n in f["runtime_calls_per_step"].items())
        print(f"{kind:7} {f['step_wall_ms']:8.3f} {f['verify_ms']:9.3f} {f['outside_verify_ms']:8.3f} | {calls}")
        print("      ops per step: " + "  ".join(f"{op.removeprefix('aten::')} {n:.1f}"
                                               for op, n in list(f["top_level_aten_ops_per_step"].items())[:12]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
