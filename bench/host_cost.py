"""The decode loop's own cost per plain token, with the step graphs made free: the host work between replays.

A tiny random Llama on the static engine at B slots, its step graphs "captured" by a stand-in whose replay does
nothing (the outputs are the capture's), so a step's wall time (the loop's ``RunStats.step_s`` over its steps:
admissions and prefills left out) is the loop's bookkeeping, input uploads, verification, history and commit ops
and the readback, not the model. On a CPU each of those device ops runs in
place of a GPU launch, so the figure tracks the launch count between replays (docs/engines.md#what-is-still-host-side);
compare trees with it on one machine (bench/in_archive.py for another commit's tree). ``--proposer eagle2``
times EAGLE-2 steps instead (a random tiny head, dynamic tree top_k 4, depth 4, 16 nodes, its drafting graphs free
too), ``medusa-chain`` and ``medusa-tree`` Medusa's (five random heads: a chain of 3, or the published 63-node
tree, from $SPECBENCH_DATA_DIR), ``draft`` a draft model's (a second random tiny Llama, K = 3): what the loop
and the proposer launch between replays. ``--queue-ahead``
queues greedy steps one ahead of their reads, as on a GPU (docs/engines.md#steps-queued-ahead).

    python bench/host_cost.py [--new-tokens 200] [--batch-size 1] [--repeats 7] [--queue-ahead] [--profile tottime]
                              [--proposer {none,eagle2,medusa-chain,medusa-tree,draft}]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specbench.engine.decode import Decoder, GenerationConfig  # noqa: E402
from specbench.checkpoints.tiny import tiny_llama  # noqa: E402
from specbench.engine.static_target import StaticTarget  # noqa: E402
from specbench.eagle.draft_head import EagleConfig, EagleHead  # noqa: E402
from specbench.proposers.eagle import EagleProposer  # noqa: E402
from specbench.medusa.heads import MedusaHeads, MedusaHeadsConfig  # noqa: E402
from specbench.proposers.medusa import MedusaProposer  # noqa: E402
from specbench.proposers.draft_model import DraftModelProposer  # noqa: E402


class _FreeReplay:
    def replay(self) -> None:
        """Nothing: the step's outputs stay what the capture wrote."""


class FreeCapture:
    """A GraphBackend whose graphs cost nothing to replay: the forward runs once, at capture."""

    def capture(self, forward, inputs):
        return _FreeReplay(), tuple(forward(inputs))

    def release_pool(self) -> None:
        pass


def tiny_target(batch_size: int) -> StaticTarget:
    return StaticTarget.from_hf_model(tiny_llama(seed=0, vocab_size=512), batch_size=batch_size, compile=False,
                                      graph_backend=FreeCapture(), prefill_graphs=False)


def eagle2(target: StaticTarget) -> EagleProposer:
    """An EAGLE-2 proposer over a random head of the tiny target's sizes, its graphs through FreeCapture."""
    torch.manual_seed(0)
    head = EagleHead(EagleConfig(target.hidden_size, 2 * target.hidden_size, 4, 2, target.vocab_size), with_embed=False)
    return EagleProposer.from_options(target, head=head, top_k=4, depth=4, total_tokens=16, graph_backend=FreeCapture())


def medusa(target: StaticTarget, tree: bool) -> MedusaProposer:
    """Five random one-layer Medusa heads of the tiny target's sizes: a chain of 3, or the 63-node mc_sim_7b_63 tree."""
    torch.manual_seed(0)
    heads = MedusaHeads(MedusaHeadsConfig(5, 1, target.hidden_size, target.vocab_size, True))
    options = {"tree": "mc_sim_7b_63"} if tree else {"num_speculative_tokens": 3}
    return MedusaProposer.from_options(target, heads=heads, **options)


def draft_model(target: StaticTarget) -> DraftModelProposer:
    """A draft model of K = 3: a second random tiny Llama of the target's vocabulary, its step graphs free too."""
    draft = StaticTarget.from_hf_model(tiny_llama(seed=1, vocab_size=512), batch_size=target.batch_size,
                                       compile=False, graph_backend=FreeCapture(), prefill_graphs=False)
    return DraftModelProposer.from_options(target, draft=draft, num_speculative_tokens=3)


PROPOSERS = {"none": lambda target: None, "eagle2": eagle2, "medusa-chain": lambda target: medusa(target, False),
             "medusa-tree": lambda target: medusa(target, True), "draft": draft_model}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--new-tokens", type=int, default=200, help="max_new_tokens of every request (EOS ignored)")
    parser.add_argument("--batch-size", type=int, default=1, help="slots, each with one 64-token prompt")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs after two warm-ups; the median is printed")
    parser.add_argument("--proposer", choices=tuple(PROPOSERS), default="none",
                        help="plain steps (none), EAGLE-2's, Medusa's or a draft model's")
    parser.add_argument("--queue-ahead", action="store_true",
                        help="queue greedy steps one ahead of their reads, as on a GPU (every proposer here; a CPU "
                             "reads each step first)")
    parser.add_argument("--profile", metavar="SORT", help="also cProfile five runs, sorted by SORT (tottime, cumulative)")
    args = parser.parse_args(argv)
    target = tiny_target(args.batch_size)
    prompts = [torch.randint(0, 512, (64,), generator=torch.Generator().manual_seed(b)) for b in range(args.batch_size)]
    config = GenerationConfig(max_new_tokens=args.new_tokens, ignore_eos=True)
    decoder = Decoder(target, PROPOSERS[args.proposer](target), config)
    decoder.queue_ahead = args.queue_ahead
    run = lambda: decoder.generate_all(prompts)  # noqa: E731
    torch.set_num_threads(1)
    run(), run()
    times = []
    for _ in range(args.repeats):
        run()
        times.append(decoder.stats.step_s / decoder.stats.num_steps)  # the steps alone: no admission, no prefill
    if args.profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.runcall(lambda: [run() for _ in range(5)])
        pstats.Stats(profiler).sort_stats(args.profile).print_stats(30)
    kind = ("plain" if args.proposer == "none" else args.proposer) + (" (queued ahead)" if decoder._ahead else "")
    print(f"loop cost per {kind} step, free replays, B = {args.batch_size}: {statistics.median(times) * 1e6:.1f} us "
          f"(median of {args.repeats}; min {min(times) * 1e6:.1f} us)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
