"""Where the decode loop's per-step host time goes as B grows: wall time per phase on a tiny random Llama.

Each phase is a method or function of the loop wrapped with ``time.perf_counter`` (the device synchronised
around it on CUDA, so queued GPU work is charged to the phase that launched it); ``other`` is the step's time
outside the named phases (building the verify inputs, the loop's own bookkeeping). Phases that the loop
does not have are skipped. The model is tiny and eager, so on the CPU the figures are almost all host work: how
it grows with B is the point.

    python bench/profile_batched_step.py [--batch-sizes 1,8,32] [--runs plain,medusa-chain,medusa-tree]
        [--new-tokens 32] [--device cpu] [--hidden 64] [--repeats 3] [--threads 1] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _phase_clock import PhaseClock  # noqa: E402

from specbench.io.atomic_write import write_text_atomic  # noqa: E402
from specbench.cli.arguments import list_argument_type  # noqa: E402
from specbench.checkpoints.tiny import tiny_llama  # noqa: E402
from specbench.engine import decode, static_target  # noqa: E402
from specbench.engine.decode import Decoder, GenerationConfig  # noqa: E402
from specbench.engine.static_target import StaticTarget  # noqa: E402
from specbench.medusa.heads import MedusaHeads, MedusaHeadsConfig  # noqa: E402
from specbench.engine.proposer import for_batch  # noqa: E402
from specbench.proposers.medusa import MedusaProposer  # noqa: E402

TREE = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 0, 0, 0]]
# (phase, where it lives: "decoder", "target", "graphs", "module" = engine/decode.py's namespace, "target_module" =
# engine/static_target.py's or "history" = the loop's _History class, attribute); phases the loop lacks are skipped
PHASES = (
    ("refill", "decoder", "_refill"),
    ("propose", "decoder", "_propose"),
    ("pack", "target_module", "fill_buffers"),
    ("forward", "graphs", "run"),
    ("verify", "module", "verify_batch"),
    ("readback", "module", "read_step"),
    ("commit", "target", "commit_accepted"),
    ("history", "history", "record"),
    ("advance", "decoder", "_record"),
    ("finish", "decoder", "_finish"),
)
SHARED = ("module", "target_module", "history")  # wrapped for every object: restored after the run


def instrument(clock: PhaseClock, decoder: Decoder) -> list:
    """Wrap the loop's phases (instance attributes, the engine modules' functions); returns the undo list."""
    owners = {"decoder": decoder, "target": decoder.target, "graphs": decoder.target.graphs, "module": decode,
              "target_module": static_target,
              "history": getattr(decode, "_History", None)}  # a class: its method is wrapped, then restored
    undo = []
    for name, where, attribute in PHASES:
        owner = owners[where]
        if owner is None or not hasattr(owner, attribute):
            continue
        original = getattr(owner, attribute)
        setattr(owner, attribute, clock.wrap(name, original))
        undo.append((owner, attribute, original, where in SHARED))
    decoder._step = clock.wrap("step", decoder._step)
    return undo


def tiny_target(hidden: int, vocab: int, device: str) -> StaticTarget:
    return StaticTarget.from_hf_model(tiny_llama(seed=0, vocab_size=vocab, hidden_size=hidden, max_context=512).to(device))


def tiny_heads(hidden: int, vocab: int, device: str) -> MedusaHeads:
    torch.manual_seed(1)
    heads = MedusaHeads(MedusaHeadsConfig(5, 1, hidden, vocab, True))
    for name, p in heads.named_parameters():
        torch.nn.init.normal_(p, std=0.5 if name.endswith("bias") else 0.2)
    return heads.to(device)


def proposer_for(run: str, static: StaticTarget, heads: MedusaHeads):
    if run == "plain":
        return None
    options = {"num_speculative_tokens": 3} if run == "medusa-chain" else {"tree": TREE}
    return MedusaProposer.from_options(static, heads=heads, **options)


def profile(static, heads, run: str, batch: int, args) -> dict:
    """One timed run of ``batch`` x 2 prompts at ``batch`` slots (after an untimed warm-up); ms per step by phase."""
    gen = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(0, args.vocab, (int(n),), generator=gen) for n in torch.randint(4, 24, (2 * batch,), generator=gen)]
    config = GenerationConfig(max_new_tokens=args.new_tokens, ignore_eos=True)
    target = static.with_batch_size(batch)  # the weights shared
    Decoder(target, for_batch(proposer_for(run, static, heads), batch), config).generate_all(prompts[:batch])
    decoder = Decoder(target, for_batch(proposer_for(run, static, heads), batch), config)
    decoder.queue_ahead = False  # the clock syncs around each phase: steps read one by one, as timed
    clock = PhaseClock(static.device)
    undo = instrument(clock, decoder)
    try:
        start = time.perf_counter()
        decoder.generate_all(prompts)
        total = time.perf_counter() - start
    finally:  # a failed run leaves no class wrapped for the next one
        for owner, attribute, original, restore in undo:
            if restore:
                setattr(owner, attribute, original)
    steps = decoder.stats.num_steps
    inner = sum(s for n, s in clock.seconds.items() if n not in ("step", "refill", "finish"))
    per_step = {n: s / steps * 1e3 for n, s in clock.seconds.items()}
    per_step["other"] = (clock.seconds["step"] - inner) / steps * 1e3
    return {"run": run, "batch_size": batch, "steps": steps, "total_ms": total * 1e3, "ms_per_step": per_step}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", type=list_argument_type("batch_size"), default="1,8,32",
                        help="comma-separated distinct B values >= 1 (default 1,8,32)")
    parser.add_argument("--runs", default="plain,medusa-chain,medusa-tree", help="plain, medusa-chain, medusa-tree")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per point; each phase's fastest is kept")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: steadier host timings)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    static = tiny_target(args.hidden, args.vocab, args.device)
    heads = tiny_heads(args.hidden, args.vocab, args.device)
    rows = []
    for run in args.runs.split(","):
        for batch in args.batch_sizes:
            runs = [profile(static, heads, run, batch, args) for _ in range(args.repeats)]
            row = {**runs[0], "ms_per_step": {name: min(r["ms_per_step"][name] for r in runs) for name in runs[0]["ms_per_step"]}}
            rows.append(row)
            phases = sorted(row["ms_per_step"].items(), key=lambda kv: -kv[1])
            print(f"{run:13} B={batch:<3} {row['steps']:4} steps  " +
                  "  ".join(f"{name} {ms:.3f}" for name, ms in phases) + "  (ms/step)")
    if args.json:
        write_text_atomic(Path(args.json), json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
