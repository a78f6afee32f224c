"""Where a speculative decoding step's time goes, on the 7B shape (or any target): per-phase wall time
(propose, target forward, verdict, its readback, KV commit), synchronising the device after each phase so GPU
work is charged to the phase that queued it, then a torch.profiler table of the same decoding, for plain decoding
and for an oracle chain at full acceptance, with the kernels launched per step.

For the static engine the phases run with its CUDA graphs (as decoding does) and the profiler tables
over the same model without graphs, so each kernel a graph replays shows up by name.

    python bench/profile_step.py SYNTH_DIR OUT_DIR [--engine static|eager] [--device cuda] [--k 3] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _phase_clock import PhaseClock as _PhaseClock  # noqa: E402

from specbench.checkpoints.resolve import load_target_model  # noqa: E402
from specbench.engine import decode  # noqa: E402
from specbench.engine.decode import Decoder, GenerationConfig  # noqa: E402
from specbench.engine.hf_target import HFTarget  # noqa: E402
from specbench.engine.static_target import StaticTarget  # noqa: E402
from specbench.proposers.scripted import ScriptedProposer  # noqa: E402


class PhaseClock(_PhaseClock):
    """The phase clock with the per-step report this script prints."""

    def report(self, title: str, total: float, prefill: float, steps: int) -> str:
        lines = [f"{title}: {total * 1e3:.1f} ms total, prefill {prefill * 1e3:.1f} ms, {steps} steps, "
                 f"{(total - prefill) / steps * 1e3:.2f} ms/step after the prefill"]
        total -= prefill
        for name, seconds in sorted(self.seconds.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {name:10} {seconds / steps * 1e3:8.2f} ms/step  ({self.calls[name]} calls, "
                         f"{seconds / total:5.1%})")
        accounted = sum(self.seconds.values())
        lines.append(f"  {'other':10} {(total - accounted) / steps * 1e3:8.2f} ms/step  ({(total - accounted) / total:5.1%})")
        return "\n".join(lines)


def phase_breakdown(target, proposer, prompt: torch.Tensor, new_tokens: int, title: str) -> str:
    clock = PhaseClock(target.device)
    originals = (target.verify, target.commit_accepted, decode.verify_batch, decode.read_step)
    target.verify = clock.wrap("forward", target.verify)
    target.commit_accepted = clock.wrap("commit", target.commit_accepted)  # the loop's commit, once per step
    decode.verify_batch = clock.wrap("verdict", decode.verify_batch)  # greedy verification on the device
    decode.read_step = clock.wrap("readback", decode.read_step)  # the step's one device-to-host read
    if proposer is not None:
        proposer.propose = clock.wrap("propose", proposer.propose)
    try:
        decoder = Decoder(target, proposer, GenerationConfig(max_new_tokens=new_tokens, ignore_eos=True))
        decoder.queue_ahead = False  # the clock syncs around each phase: steps read one by one, as timed
        result = decoder.generate(prompt)
    finally:
        target.verify, target.commit_accepted, decode.verify_batch, decode.read_step = originals
        if proposer is not None:
            del proposer.propose
    steps = clock.calls["commit"]
    return clock.report(f"{title} (MAL {result.counters.mean_acceptance_length:.2f})", result.timing.total_s,
                        result.timing.time_to_first_token_s, steps)


def profiler_table(target, proposer, prompt: torch.Tensor, new_tokens: int) -> str:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if target.device.type == "cuda" else [])
    decoder = Decoder(target, proposer, GenerationConfig(max_new_tokens=new_tokens, ignore_eos=True))
    with profile(activities=activities) as prof:
        result = decoder.generate(prompt)
    averages = prof.key_averages()
    steps = result.counters.num_target_forwards
    kernels = sum(e.count for e in averages if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA)
    header = f"{steps} target forwards; {kernels / max(steps, 1):.0f} CUDA kernels per forward\n" if kernels else ""
    sort = "self_cuda_time_total" if target.device.type == "cuda" else "self_cpu_time_total"
    return (header + averages.table(sort_by="self_cpu_time_total", row_limit=25) + "\n"
            + (averages.table(sort_by=sort, row_limit=15) if sort != "self_cpu_time_total" else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("synth_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--engine", choices=("static", "eager"), default="static")
    args = parser.parse_args()

    device = torch.device(args.device)
    directory, dtype = str(Path(args.synth_dir) / "target"), getattr(torch, args.dtype)
    if args.engine == "static":
        target = StaticTarget.from_pretrained(directory, dtype=dtype, device=device)
        # the same module without graphs, for the profiler's per-kernel tables
        profiled = target.with_batch_size(1, cuda_graphs=False)
    else:
        target = profiled = HFTarget(load_target_model(directory, dtype=dtype, device=str(device)))
    prompt = torch.randint(3, target.vocab_size, (args.prompt_len,), generator=torch.Generator().manual_seed(0))
    config = GenerationConfig(max_new_tokens=args.new_tokens + 16, ignore_eos=True)
    truth = Decoder(target, None, config).generate(prompt).output_token_ids  # also the warm-up
    Decoder(target, ScriptedProposer(truth, args.k, target.vocab_size), config).generate(prompt)  # warm-up

    sections = [
        phase_breakdown(target, None, prompt, args.new_tokens, "plain"),
        phase_breakdown(target, ScriptedProposer(truth, args.k, target.vocab_size), prompt, args.new_tokens,
                        f"oracle chain K={args.k}"),
        f"== torch.profiler ({args.engine}), oracle chain\n" + profiler_table(
            profiled, ScriptedProposer(truth, args.k, target.vocab_size), prompt, args.new_tokens),
        f"== torch.profiler ({args.engine}), plain\n" + profiler_table(profiled, None, prompt, args.new_tokens),
    ]
    text = "\n\n".join(sections)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile_step.txt").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
