"""Where a plain decode step's time goes inside its CUDA graph: kernel by kernel, and the idle gaps between them.

bench/profile_step.py times kernels in an eager pass (no graph), which shows what each kernel costs but not what
the graph's ~400 small kernels cost in gaps when they are replayed back to back. This replays the static engine's
own plain step graph (7B shape, B = 1, fed on the device as bench/plain_headroom.py's chained mode does) under
torch.profiler, a pause between replays so they part clearly in the trace, and reports per replay, as medians: the
kernels, the span from the first kernel's start to the last one's end, the time some kernel runs (busy), the idle
gaps, busy time by kind (bench/profile_batched_kernels.py's kinds) and the kernels that take the most. With the
copy-bandwidth ceiling, the span's and the matmuls' fractions of it. The raw trace is kept (gzipped), so the
analysis can be rerun anywhere with --analyze.

With --step eagle-draft it replays EAGLE's whole draft graph instead (#29's figure to drive down: every expansion's
decoder layer, the target's lm_head, log-softmax and top-k, and the selection between them; EAGLE-2's dynamic tree
at --top-k/--depth/--total-tokens, the 7B speed case's 8/6/60 by default, head `SYNTH_DIR/eagle-profile`), after a
short decode has captured it. Its ceiling is what the expansions must read: the head's layer and the lm_head, once
per expansion, at the copy bandwidth. --compile-draft is a candidate for lowering it: the whole draft step compiled
by inductor before capture, so the ~70 small kernels around each expansion's matmuls fuse (COMPILE_DRAFT, on since).
--chunked-topk CHUNK is the next: the rules' top-k over the vocabulary through chunks (specbench/eagle/top_k.py's
CHUNK, off in the engine until an A/B).
With --l2-prefetch SPEC the plain step's projections prefetch the next weight into L2 (bench/_l2_prefetch.py).

    python bench/replay_profile.py OUT --synth-dir SYNTH_DIR [--replays 20] [--l2-prefetch 32:0]
    python bench/replay_profile.py OUT --synth-dir SYNTH_DIR --step eagle-draft [--compile-draft] [--chunked-topk 128]
    python bench/replay_profile.py OUT --analyze OUT/replay_trace.json.gz      # again, from a saved trace
    python bench/replay_profile.py OUT --tiny --device cpu --replays 3          # CPU smoke test (CPU ops, no graph)
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench_target import add_target_arguments, load_target  # noqa: E402
from _l2_prefetch import parse_spec, prefetching_target  # noqa: E402
from _phase_clock import sync  # noqa: E402
from plain_headroom import _device_start  # noqa: E402
from profile_batched_kernels import kind_of  # noqa: E402

from specbench.io.atomic_write import write_text_atomic  # noqa: E402

PAUSE_S = 0.002  # the host's pause between replays: a gap no graph has inside it
SPLIT_US = 500.0  # a gap this long (microseconds) parts two replays
# the CPU smoke run's: its replays are CPU ops, which a busy machine can preempt for more than SPLIT_US mid-replay
CPU_PAUSE_S, CPU_SPLIT_US = 0.05, 10_000.0


def replays_of(trace: dict) -> list[list[tuple[float, float, str]]]:
    """The trace's GPU kernels (CPU ops where it has none: the smoke test) as (start, end, name) in microseconds,
    split into replays at gaps of SPLIT_US or more (CPU_SPLIT_US between CPU ops)."""
    events = trace.get("traceEvents", [])
    kernels = [e for e in events if e.get("cat") == "kernel"]
    split = SPLIT_US if kernels else CPU_SPLIT_US
    kernels = kernels or [e for e in events if e.get("cat") == "cpu_op"]
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), e["name"]) for e in kernels)
    groups: list[list[tuple[float, float, str]]] = []
    end = None
    for start, stop, name in spans:
        if end is None or start - end >= split:
            groups.append([])
        groups[-1].append((start, stop, name))
        end = stop if end is None else max(end, stop)
    return groups


def replay_figures(kernels: list[tuple[float, float, str]]) -> dict:
    """One replay's kernel count, span, busy time (the union of kernel intervals), gaps and busy time by kind (us)."""
    busy, by_kind, reach = 0.0, defaultdict(float), kernels[0][0]
    for start, stop, name in kernels:  # sorted by start: count each microsecond once
        busy += max(0.0, stop - max(start, reach))
        by_kind[kind_of(name)] += stop - start
        reach = max(reach, stop)
    span = reach - kernels[0][0]
    return {"kernels": len(kernels), "span_us": span, "busy_us": busy, "gaps_us": span - busy, "by_kind_us": by_kind}


def analyze(trace: dict, ceiling_us: float | None = None) -> dict:
    """Medians over the trace's replays (the first dropped when there are more than two: it may carry warm-up),
    and the kernels that take the most time per replay."""
    groups = replays_of(trace)
    if not groups:
        raise ValueError("the trace holds no kernel (nor CPU op): was it recorded with ProfilerActivity.CUDA?")
    groups = groups[1:] if len(groups) > 2 else groups
    figures = [replay_figures(g) for g in groups]
    median = lambda key: statistics.median(f[key] for f in figures)  # noqa: E731
    kinds = sorted({k for f in figures for k in f["by_kind_us"]})
    per_name = defaultdict(float)
    for group in groups:
        for start, stop, name in group:
            per_name[name] += (stop - start) / len(groups)
    out = {"replays": len(groups), "kernels": median("kernels"), "span_us": median("span_us"),
           "busy_us": median("busy_us"), "gaps_us": median("gaps_us"),
           "by_kind_us": {k: statistics.median(f["by_kind_us"].get(k, 0.0) for f in figures) for k in kinds},
           "top_kernels_us": sorted(per_name.items(), key=lambda kv: -kv[1])[:15], "ceiling_us": ceiling_us}
    if ceiling_us:
        out["span_of_ceiling"] = ceiling_us / out["span_us"]
        out["matmul_of_ceiling"] = ceiling_us / out["by_kind_us"]["matmul"] if out["by_kind_us"].get("matmul") else None
    return out


def weight_bytes(module: torch.nn.Module, skip: tuple[str, ...] = ()) -> int:
    return sum(p.numel() * p.element_size() for name, p in module.named_parameters() if not name.startswith(skip))


def plain_replays(args: argparse.Namespace, target, prompt: torch.Tensor) -> tuple[Callable[[int], None], int]:
    """The plain step's graph fed on the device (replay i at span ``length + i``), and the bytes it must read."""
    steps, _ = _device_start(target, prompt, args.replays + 8)
    return (lambda i: steps.replayed(prompt.numel() + i)), weight_bytes(target.module)


def eagle_draft_replays(args: argparse.Namespace, target, prompt: torch.Tensor) -> tuple[Callable[[int], None], int]:
    """EAGLE's draft graph, captured by a short decode, replayed from fixed roots; and the bytes its expansions must
    read (the head's layer and the lm_head, once per expansion: counted by running the rule once, eagerly)."""
    from specbench.eagle import top_k
    from specbench.eagle.captured import compiled_alone
    from specbench.engine.decode import Decoder, GenerationConfig
    from specbench.proposers.eagle import EagleProposer

    if args.chunked_topk:  # the candidate: the drafting rules' full-vocabulary top-k through chunks (traced as such)
        top_k.CHUNK = args.chunked_topk
    if args.tiny:
        from specbench.eagle.draft_head import EagleConfig, EagleHead
        shape = target.module.shape
        head = EagleHead(EagleConfig(shape.hidden_size, 2 * shape.hidden_size, 4, 2, target.vocab_size)).to(target.device)
        source = dict(head=head)
    else:
        source = dict(path=args.head or str(Path(args.synth_dir) / "eagle-profile"))
    proposer = EagleProposer.from_options(target, top_k=args.top_k, depth=args.depth, total_tokens=args.total_tokens,
                                          **source)
    captured, gen = proposer.captured, torch.Generator(device=target.device).manual_seed(0)
    if args.compile_draft:  # the candidate: inductor fuses the whole draft step, the graph then captures its kernels
        captured.draft_step = compiled_alone(captured._grow)  # as COMPILE_DRAFT compiles it
    Decoder(target, proposer, GenerationConfig(max_new_tokens=16, ignore_eos=True)).generate(prompt)
    dtype = proposer.lm_head.weight.dtype
    roots = (torch.randn(1, proposer.head.fc.weight.shape[0], generator=gen, device=target.device, dtype=dtype),
             torch.randn(1, target.vocab_size, generator=gen, device=target.device, dtype=dtype))  # (B, H), (B, V)
    widths = []
    eager = captured.rule.grow(*roots, lambda tokens, *rest: widths.append(tokens.shape[1]) or captured.expand(tokens, *rest))
    if args.compile_draft:  # the same draft as the eager step's? bf16 rounding may part near-ties
        same = (captured.draft(*roots)[0] == eager[0]).float().mean().item()
        print(f"compiled draft: {same:.3f} of its tokens equal the eager step's on the same roots")
    if args.chunked_topk:  # the same draft as torch.topk's? only equal log-probabilities may pick other indices
        top_k.CHUNK = 0
        plain = captured.rule.grow(*roots, captured.expand)
        top_k.CHUNK = args.chunked_topk
        same = (plain[0] == eager[0]).float().mean().item()
        print(f"chunked top-k: {same:.3f} of the eager draft's tokens equal torch.topk's on the same roots")
    per_expansion = weight_bytes(proposer.head, skip=("embed_tokens",)) + weight_bytes(proposer.lm_head)
    print(f"EAGLE draft: {len(widths)} expansions of widths {widths}, {per_expansion / 1e9:.3f} GB read by each")
    return (lambda i: captured.draft(*roots)), per_expansion * len(widths)


STEPS = {"plain": plain_replays, "eagle-draft": eagle_draft_replays}


def record(args: argparse.Namespace, trace_path: Path) -> float | None:
    """Profile ``args.replays`` replays of ``args.step``'s graph into ``trace_path``; the copy ceiling of one replay
    (us) on CUDA."""
    from torch.profiler import ProfilerActivity, profile

    target, _ = load_target(args)
    if args.l2_prefetch:
        target = prefetching_target(target, args.l2_prefetch)
    prompt = torch.randint(3, target.vocab_size, (args.prompt_tokens,), generator=torch.Generator().manual_seed(0))
    cuda = target.device.type == "cuda"
    with torch.inference_mode():
        replayed, read_bytes = STEPS[args.step](args, target, prompt)
        for i in range(4):  # warm: the graph captured, clocks up
            replayed(i)
        sync(target.device)
        with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
            for i in range(args.replays):
                replayed(4 + i)
                sync(target.device)
                time.sleep(PAUSE_S if cuda else CPU_PAUSE_S)
    prof.export_chrome_trace(str(trace_path))
    if not cuda:
        return None
    from speed_7b import copy_bandwidth
    return read_bytes / copy_bandwidth(target.device) * 1e6


def main(argv: list[str] | None = None) -> int:
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--analyze", type=Path, help="a saved replay_trace.json.gz: analyse it, record nothing")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     parents=[first])
    parser.add_argument("out", type=Path)
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--step", choices=sorted(STEPS), default="plain", help="the graph to replay (default: plain)")
    parser.add_argument("--head", help="eagle-draft: an EAGLE head directory (default: SYNTH_DIR/eagle-profile)")
    parser.add_argument("--top-k", type=int, default=8, help="eagle-draft: EAGLE-2's top_k (default 8)")
    parser.add_argument("--depth", type=int, default=6, help="eagle-draft: EAGLE-2's depth (default 6)")
    parser.add_argument("--total-tokens", type=int, default=60, help="eagle-draft: EAGLE-2's total_tokens (default 60)")
    parser.add_argument("--compile-draft", action="store_true",
                        help="eagle-draft: torch.compile the whole draft step before it is captured (COMPILE_DRAFT's way)")
    parser.add_argument("--chunked-topk", type=int, metavar="CHUNK",
                        help="eagle-draft: the drafting rules' full-vocabulary top-k through chunks of CHUNK scores "
                             "(specbench/eagle/top_k.py: single-block top-k launches instead of a multi-block one)")
    parser.add_argument("--l2-prefetch", metavar="SPEC",
                        help="plain: the step with the next weights prefetched into L2 as SPEC (O:R[:nojoin] MB) says "
                             "(bench/_l2_prefetch.py); its prefetch kernels are the kind l2_prefetch")
    if first.parse_known_args(argv)[0].analyze is None:  # recording needs a target; analysing does not
        add_target_arguments(parser)
    args = parser.parse_args(argv)
    if args.l2_prefetch:
        if args.step != "plain":
            parser.error("--l2-prefetch profiles the plain step only (--step plain)")
        try:
            parse_spec(args.l2_prefetch)
        except ValueError as error:
            parser.error(str(error))
    args.out.mkdir(parents=True, exist_ok=True)
    ceiling_us = None
    if args.analyze is None:
        raw = args.out / "replay_trace.json"
        ceiling_us = record(args, raw)
        with raw.open("rb") as src, gzip.open(args.out / "replay_trace.json.gz", "wb") as dst:
            dst.write(src.read())
        raw.unlink()
        args.analyze = args.out / "replay_trace.json.gz"
    with gzip.open(args.analyze, "rt", encoding="utf-8") as f:
        figures = analyze(json.load(f), ceiling_us)
    write_text_atomic(args.out / "replay_profile.json", json.dumps(figures, indent=2) + "\n")
    print(f"{figures['replays']} replays: {figures['kernels']:.0f} kernels, span {figures['span_us']:.1f} us, busy "
          f"{figures['busy_us']:.1f} us, gaps {figures['gaps_us']:.1f} us")
    for kind, us in sorted(figures["by_kind_us"].items(), key=lambda kv: -kv[1]):
        print(f"  {kind:10} {us:9.1f} us")
    if ceiling_us:
        matmuls = figures["matmul_of_ceiling"]
        print(f"ceiling {ceiling_us:.1f} us: the span is {figures['span_of_ceiling']:.3f} of it"
              + (f", the matmuls alone {matmuls:.3f}" if matmuls else ""))
    for name, us in figures["top_kernels_us"]:
        print(f"  {us:8.1f} us  {name[:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
