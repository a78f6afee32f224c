"""A batched admission's group prefill with its pointwise stages eager, or fused by torch.compile, side by side.

The static engine prefills every admission eagerly unless built with ``fused_prefill`` (engine/group_prefill.py).
At 32 prompts of 128 tokens a third of the eager forward is unfused pointwise work (docs/batching.md#admission). This script times one group
prefill of n prompts, for each n of ``--groups``, under each stage variant:

- ``eager``: what the engine runs by default;
- ``fused``: the engine's ``fused_prefill`` (``static_ops.compiled_prefill_ops``): every stage compiled in a dynamo
  cache of its own (a copy of its code object, so the steps' compiled stages are never recompiled by a prefill),
  automatic dynamic (the second group size recompiles it with the token count symbolic);
- ``shared``: the steps' own compiled stages (what an earlier attempt used).

For each it reports the first call's seconds (compilation included), the median wall time of ``--reps`` calls
(device synchronised) and how far the group's last-position logits are from each prompt's own one-slot
prefill (max abs difference, argmax agreement: what the decoder would see from an admission of one). Writes
OUT_DIR/prefill_variants.json atomically and prints a table.

    python bench/prefill_variants.py OUT_DIR --synth-dir SYNTH_DIR [--groups 2,8,32] [--prompt-len 128]
    python bench/prefill_variants.py OUT_DIR --tiny --device cpu --variants eager --groups 2     # CPU smoke test
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench_target import add_target_arguments, load_target  # noqa: E402
from _phase_clock import sync, timed_calls  # noqa: E402

from specbench.io.atomic_write import write_text_atomic  # noqa: E402
from specbench.compile_watch import compiled_graphs  # noqa: E402
from specbench.cli.arguments import list_argument_type  # noqa: E402
from specbench.engine.group_prefill import prefill_group  # noqa: E402
from specbench.engine.static_target import StaticTarget  # noqa: E402
from specbench.engine.static_ops import EAGER_OPS, StepOps, compiled_ops, compiled_prefill_ops  # noqa: E402
from specbench.env import environment_fingerprint  # noqa: E402

VARIANTS = ("eager", "fused", "shared")


def variant_ops(name: str, target: StaticTarget) -> StepOps:
    if name == "eager":
        return EAGER_OPS
    if name == "fused":
        return compiled_prefill_ops()  # the engine's fused_prefill
    return target.ops if target.ops.compiled else compiled_ops()  # the steps' stages


def measure(target: StaticTarget, ops: StepOps, prompts: list[torch.Tensor], reps: int) -> tuple[dict, torch.Tensor]:
    """(first-call seconds and median wall ms of one group prefill of ``prompts`` into slots 0..n-1, its logits)."""
    slots = list(range(len(prompts)))

    def admit() -> torch.Tensor:
        for slot in slots:
            target.release(slot)
        outputs = prefill_group(target.module, target._cache, slots, prompts, ops=ops)
        return torch.cat([o.logits for o in outputs])  # (n, V)

    graphs = compiled_graphs()
    sync(target.device)
    start = time.perf_counter()
    logits = admit()
    sync(target.device)
    first = time.perf_counter() - start
    graphs = compiled_graphs() - graphs
    timed_from = compiled_graphs()
    times = timed_calls(target.device, admit, reps)
    return {"first_call_s": first, "graphs_compiled_first_call": graphs, "graphs_compiled_while_timed": compiled_graphs() - timed_from,
            "wall_ms": statistics.median(times) * 1e3}, logits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    add_target_arguments(parser)
    parser.add_argument("--groups", type=list_argument_type("batch_size"), default="2,8,32",
                        help="prompts per admission, comma-separated (default 2,8,32)")
    parser.add_argument("--variants", type=lambda text: [v.strip() for v in text.split(",")], default=list(VARIANTS),
                        help=f"stage variants to time, comma-separated, from {', '.join(VARIANTS)} (default all)")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args(argv)
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown or min(args.groups) < 2 or args.prompt_len < 1 or args.reps < 1:
        parser.error(f"--variants from {', '.join(VARIANTS)} (got {', '.join(unknown) or 'those'}); --groups of at "
                     "least 2 prompts (one prompt takes the single-prompt prefill); --prompt-len and --reps >= 1")
    static, dtype = load_target(args)
    target = static.with_batch_size(max(args.groups))  # the weights shared
    target.reserve(args.prompt_len + 16)
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, static.vocab_size, (args.prompt_len,), generator=generator).to(static.device)
               for _ in range(max(args.groups))]
    report = {"schema_version": 1, "env": environment_fingerprint(device=str(static.device), dtype=dtype),
              "settings": {"groups": args.groups, "prompt_len": args.prompt_len, "reps": args.reps}, "points": []}
    # each prompt's one-slot prefill (the engine's single-prompt path), the reference of every variant
    reference_logits = torch.cat([target.prefill(slot, p).logits for slot, p in enumerate(prompts)])  # (n, V)
    print(HEADER, flush=True)
    for name in args.variants:
        ops = variant_ops(name, target)
        for n in args.groups:
            figures, logits = measure(target, ops, prompts[:n], args.reps)
            reference = reference_logits[:n]
            figures.update({"variant": name, "prompts": n, "tokens": n * args.prompt_len,
                            "max_abs_logit_diff": float((logits - reference).abs().max()),
                            "argmax_agreement": float((logits.argmax(-1) == reference.argmax(-1)).float().mean())})
            report["points"].append(figures)
            print(row(figures), flush=True)  # as measured: a run cut short still shows its points
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out_dir / "prefill_variants.json", json.dumps(report, indent=1))
    return 0


HEADER = (f"{'variant':8} {'prompts':>7} {'tokens':>6} {'first s':>8} {'compiled':>8} {'wall ms':>8} {'max |dlogit|':>12} "
          f"{'argmax ==':>9}")


def row(p: dict) -> str:
    return (f"{p['variant']:8} {p['prompts']:7} {p['tokens']:6} {p['first_call_s']:8.2f} {p['graphs_compiled_first_call']:8} "
            f"{p['wall_ms']:8.2f} {p['max_abs_logit_diff']:12.4g} {p['argmax_agreement']:9.3f}")


if __name__ == "__main__":
    raise SystemExit(main())
