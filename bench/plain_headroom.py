"""How much of plain decoding's time per token is host work between graph replays, and what several decode steps
per graph replay would give: the figures that pick the technique for plain decoding at 0.80 of the copy-bandwidth
ceiling (docs/engines.md). Bench-only: the engine's code is not changed.

One prompt, N new tokens, greedy, one process, on the static engine's target at batch size 1 (slot 0); each mode
after a warm-up pass:
  loop      the engine's decode loop (Decoder without a proposer): what plain decoding runs today, each step queued
            one ahead of the host's reads (docs/engines.md#steps-queued-ahead)
  loop-sync the same loop reading each step before queueing the next (queue_ahead = False): the A/B of queueing
  verify    target.verify, a host read of the argmax and commit per token: the loop without its bookkeeping
  chained   the plain step's graph replayed back to back (at each step's attention span), the next token fed on the
            device (argmax into the step's input, the cache length advanced on the device): no host read between steps
  steps-K   K such steps captured as one CUDA graph at the span of the run's last step, replayed N / K times (CUDA
            only)
With --triton-attention (CUDA only), a second copy of the target whose verify attention is bench/_decode_attention.py's
Triton kernel instead of SDPA adds loop-triton and verify-triton: the kernel's A/B in the same process.
With --layer-compile, another copy whose every decoder layer is one torch.compile region (max-autotune, the stages'
eager bodies inside; one compiled graph serves all layers) adds loop-layers: the bound on fusing across the engine's
stage boundaries, gpt-fast's technique (at one row inductor turns each matmul into a tuned reduction, so SwiGLU's
product can be computed inside the down projection that reads it). Layers, not the whole forward: compiled whole, the
cache is one input and each layer's write a view of it, and inductor copies each layer's whole cache per step (seen in
its CPU code); a layer's cache is its own input, written in place.
With --fused-gemv (CUDA only), another copy whose one-row steps run bench/_fused_forward.py's forward over
bench/_fused_gemv.py's Triton kernels adds loop-fused: each projection a Triton GEMV, the norms and SwiGLU computed
inside the GEMVs that read them (no norm or SwiGLU kernel); with --triton-attention too, loop-fused-triton also swaps
the attention. --fused-inductor adds loop-fused-inductor: the same forward, each stage and its matmul compiled as one
max-autotuned function instead (inductor's own fusion across exactly those boundaries).
With --l2-prefetch SPECS, another target per spec whose projections prefetch the next weight's first bytes into L2 on a
side stream while the small kernels between matmuls run (bench/_l2_prefetch.py) adds loop-l2-SPEC: SPEC is O:R, the
megabytes prefetched in the attention window and in every other window, joined before each matmul, or O:R:nojoin,
joined only before the lm_head.
Each mode's tokens are compared with the first mode's (the loop's unless --modes orders otherwise: the same
greedy continuation). The modes run in turn, --rounds
times (alternating, so a drifting clock moves them alike); each figure is the median over rounds. Prints ms per
token (decode steps after the first token) and the fraction of the ceiling (weight bytes / copy bandwidth), writes
OUT/plain_headroom.json.

    python bench/plain_headroom.py OUT --synth-dir SYNTH_DIR [--new-tokens 128] [--steps 4,8]
    python bench/plain_headroom.py OUT --tiny --device cpu --new-tokens 16          # CPU smoke test
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench_target import add_target_arguments, load_target  # noqa: E402
from _fused_forward import fused_plain_forward, inductor_kernels  # noqa: E402
from _l2_prefetch import prefetching_target  # noqa: E402
from _phase_clock import sync  # noqa: E402
from speed_7b import copy_bandwidth  # noqa: E402

from specbench.io.atomic_write import write_text_atomic  # noqa: E402
from specbench.engine import static_llama  # noqa: E402
from specbench.engine.decode import Decoder, GenerationConfig  # noqa: E402
from specbench.engine.static_cache import attention_span  # noqa: E402
from specbench.engine.step_inputs import SlotInput  # noqa: E402

PLAIN = ("plain", 1)  # the plain step's (kind, width): its static buffers' key


def loop_mode(target, prompt: torch.Tensor, n: int, ahead: bool = True) -> tuple[list[int], float]:  # ahead: also on a CPU
    """(tokens, seconds per decode step) of the engine's own plain decoding, its steps queued ahead or not."""
    decoder = Decoder(target, None, GenerationConfig(max_new_tokens=n, ignore_eos=True))
    decoder.queue_ahead = ahead
    result = decoder.generate(prompt)
    return list(result.output_token_ids), result.timing.per_token_latency_s


def _start(target, prompt: torch.Tensor, n: int) -> int:
    """Prefill ``prompt`` into slot 0 of a cache with room for ``n`` more tokens; the first output token."""
    target.reserve(prompt.numel() + n + 1, 0)
    target.prepare_steps(prompt.numel(), ("plain",))  # every span's plain graph, never captured while timed
    return int(target.prefill(0, prompt).logits[-1].argmax())


def verify_mode(target, prompt: torch.Tensor, n: int) -> tuple[list[int], float]:
    """Per token: verify the last token, read its argmax on the host, commit."""
    tokens = [_start(target, prompt, n)]
    sync(target.device)
    start = time.perf_counter()
    for _ in range(n - 1):
        logits = target.verify([SlotInput([tokens[-1]], [0])]).logits  # (1, 1, V)
        tokens.append(int(logits[0, 0].argmax()))
        target.commit([[0]])
    sync(target.device)
    return tokens, (time.perf_counter() - start) / (n - 1)


class DeviceSteps:
    """Plain decoding steps that feed themselves on the device: the step's input buffer takes its own argmax, the
    cache's device length advances, each token lands in ``out`` at a device-side counter."""

    def __init__(self, target, n: int):
        self.target = target
        self.buffers = target._buffers[PLAIN]  # the plain kind's static inputs (a verify allocated them)
        self.out = torch.zeros(n, dtype=torch.long, device=target.device)  # (N,)
        self.count = torch.zeros(1, dtype=torch.long, device=target.device)  # (1,) tokens written

    def span(self, length: int) -> int:
        """The attention span of a plain step after ``length`` committed entries (host arithmetic, no read)."""
        return attention_span(length + 1, self.target.cache_capacity)

    def _feed(self, logits: torch.Tensor) -> None:
        token = logits[:1].argmax(dim=-1)  # (1,)
        self.out.index_copy_(0, self.count, token)
        self.count.add_(1)
        self.buffers.ids.copy_(token[:, None])  # (B, W) = (1, 1)
        self.target._cache.lengths.add_(1)  # (B,) = (1,)

    def replayed(self, length: int) -> None:
        """One step after ``length`` committed entries through the target's own plain graph of that span (or its
        eager forward on the CPU)."""
        logits, _, _ = self.target._run(*PLAIN, self.span(length), self.buffers)  # (1, V)
        self._feed(logits)

    def traced(self, span: int) -> None:
        """One step over the first ``span`` cache entries, as code a CUDA graph can capture."""
        logits, _, _ = self.target._forward(self.buffers, span)  # (1, V)
        self._feed(logits)


def _device_start(target, prompt: torch.Tensor, n: int) -> tuple[DeviceSteps, int]:
    """Prefill, then one ordinary plain verify (it allocates the plain buffers and captures the kind's graph) fed the
    first token and left uncommitted: the device steps commit by advancing the length, the first one this token."""
    first = _start(target, prompt, n)
    target.verify([SlotInput([first], [0])])
    target._pending = False  # its K/V are rewritten by the first device step, from the same input
    steps = DeviceSteps(target, n)
    steps.buffers.ids.fill_(first)
    return steps, first


def chained_mode(target, prompt: torch.Tensor, n: int) -> tuple[list[int], float]:
    steps, first = _device_start(target, prompt, n)
    length = prompt.numel()
    sync(target.device)
    start = time.perf_counter()
    for i in range(n - 1):
        steps.replayed(length + i)
    sync(target.device)
    seconds = (time.perf_counter() - start) / (n - 1)
    target._cache.host_lengths[0] += n - 1
    return [first, *steps.out[: n - 1].tolist()], seconds


def steps_mode(target, prompt: torch.Tensor, n: int, k: int) -> tuple[list[int], float]:
    """K device steps captured as one CUDA graph (warm-up on a side stream first, as capture requires), every step
    over the span of the run's last step: one graph replays them all."""
    rounds = (n - 1) // k
    steps, first = _device_start(target, prompt, rounds * k + 1)
    span = steps.span(prompt.numel() + rounds * k - 1)
    length, ids = target._cache.lengths.clone(), steps.buffers.ids.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        steps.traced(span)  # warm-up: the same kernels the capture records
    torch.cuda.current_stream().wait_stream(side)
    target._cache.lengths.copy_(length)
    steps.buffers.ids.copy_(ids)
    steps.count.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(k):
            steps.traced(span)
    sync(target.device)
    start = time.perf_counter()
    for _ in range(rounds):
        graph.replay()
    sync(target.device)
    seconds = (time.perf_counter() - start) / (rounds * k)
    target._cache.host_lengths[0] += rounds * k
    return [first, *steps.out[: rounds * k].tolist()], seconds


class TritonAttention:
    """SDPA with an additive mask (every verify) through the Triton kernel while ``on``: graphs captured meanwhile
    record it; prefills (no mask) and graphs captured with ``on`` False keep SDPA."""

    def __init__(self):
        from _decode_attention import attend
        self.attend, self.sdpa, self.on = attend, F.scaled_dot_product_attention, False
        static_llama.F = SimpleNamespace(**{**vars(F), "scaled_dot_product_attention": self})  # the engine's only

    def __call__(self, q, k, v, attn_mask=None, **options):
        if self.on and attn_mask is not None:
            return self.attend(q, k, v, attn_mask[:, 0])  # bias (B, 1, W, K) -> (B, W, K)
        return self.sdpa(q, k, v, attn_mask=attn_mask, **options)

    def run(self, mode):
        self.on = True
        try:
            return mode()
        finally:
            self.on = False


class ModuleView:
    """``module`` with its forward replaced by ``forward``, as a variant target's module: the variant shares the
    weights (one copy of a 7B fits next to its variants on a 78 GB card), its own graphs and cache."""

    def __init__(self, module, forward):
        self._module, self._forward = module, forward

    def __call__(self, *args, **kwargs):
        return self._forward(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._module, name)


def variant(target, forward):
    """Another target over ``target``'s module (weights shared), whose forward passes are ``forward(module)``'s."""
    other = target.with_batch_size(1)
    other.module = ModuleView(target.module, forward(target.module))
    return other


def layer_compiled(module):
    """``module``'s forward with each decoder layer compiled as one region, its stages' eager bodies inside
    (max-autotune's coordinate-descent tuning makes every one-row matmul a tuned reduction); the layers share the
    compiled code, which the span and prefill widths recompile a few times while graphs are captured, before any
    timing. The compiled layers stand in only while this forward runs (a graph replay runs no Python)."""
    from specbench.engine.static_ops import EAGER_OPS
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    layers = module.model.layers
    compiled = [torch.compile(layer.forward, mode="max-autotune-no-cudagraphs", dynamic=None) for layer in layers]

    def forward(*args, **kwargs):
        for layer, step in zip(layers, compiled):
            layer.forward = lambda *inputs, step=step: step(*inputs[:-1], EAGER_OPS)  # inputs[-1]: the target's ops
        try:
            return module(*args, **kwargs)
        finally:
            for layer in layers:
                del layer.forward

    return forward


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    add_target_arguments(parser)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--steps", default="4,8", help="K of the steps-K modes (CUDA only), comma-separated")
    parser.add_argument("--rounds", type=int, default=3, help="times every mode runs, in turn (median reported)")
    parser.add_argument("--triton-attention", action="store_true",
                        help="add loop-triton and verify-triton: a second target whose verify attention is Triton's")
    parser.add_argument("--fused-gemv", action="store_true",
                        help="add loop-fused: another target whose one-row steps run Triton GEMVs with the norms and "
                             "SwiGLU inside (CUDA only)")
    parser.add_argument("--modes", help="run only these modes, comma-separated, in this order (default: every mode the "
                        "options give); the first is the reference whose tokens the others must match")
    parser.add_argument("--fused-inductor", action="store_true",
                        help="add loop-fused-inductor: the fused forward with each stage and its matmul compiled as one")
    parser.add_argument("--layer-compile", action="store_true",
                        help="add loop-layers: another target whose every decoder layer is one compiled region")
    parser.add_argument("--l2-prefetch", metavar="SPECS",
                        help="add loop-l2-SPEC per comma-separated SPEC O:R[:nojoin]: a target that prefetches O MB of "
                             "the output projection during attention and R MB of every other next weight into L2")
    parser.add_argument("--l2-programs", type=int, help="programs of each L2 prefetch (default: two per SM)")
    args = parser.parse_args(argv)
    target, dtype = load_target(args)
    device = target.device
    prompt = torch.randint(3, target.vocab_size, (args.prompt_tokens,), generator=torch.Generator().manual_seed(0))
    modes = {"loop": lambda: loop_mode(target, prompt, args.new_tokens),
             "loop-sync": lambda: loop_mode(target, prompt, args.new_tokens, ahead=False),
             "verify": lambda: verify_mode(target, prompt, args.new_tokens),
             "chained": lambda: chained_mode(target, prompt, args.new_tokens)}
    if device.type == "cuda":
        for k in (int(x) for x in args.steps.split(",") if x):
            modes[f"steps-{k}"] = lambda k=k: steps_mode(target, prompt, args.new_tokens, k)
        if args.triton_attention:
            patch, other = TritonAttention(), target.with_batch_size(1)
            modes["loop-triton"] = lambda: patch.run(lambda: loop_mode(other, prompt, args.new_tokens))
            modes["verify-triton"] = lambda: patch.run(lambda: verify_mode(other, prompt, args.new_tokens))
    if args.fused_gemv and device.type == "cuda":
        from _decode_attention import attend
        from _fused_gemv import TRITON
        fused = variant(target, lambda module: fused_plain_forward(module, TRITON))
        modes["loop-fused"] = lambda: loop_mode(fused, prompt, args.new_tokens)
        if args.triton_attention:
            both = variant(target, lambda module: fused_plain_forward(module, TRITON, attend))
            modes["loop-fused-triton"] = lambda: loop_mode(both, prompt, args.new_tokens)
    if args.fused_inductor:
        kernels = inductor_kernels()
        inductor = variant(target, lambda module: fused_plain_forward(module, kernels))
        modes["loop-fused-inductor"] = lambda: loop_mode(inductor, prompt, args.new_tokens)
    if args.layer_compile:
        layers = variant(target, layer_compiled)
        modes["loop-layers"] = lambda: loop_mode(layers, prompt, args.new_tokens)
    for spec in args.l2_prefetch.split(",") if args.l2_prefetch else ():
        try:
            other = prefetching_target(target, spec, args.l2_programs)
        except ValueError as error:
            parser.error(str(error))
        modes[f"loop-l2-{spec}"] = lambda other=other: loop_mode(other, prompt, args.new_tokens)
    if args.modes:  # the reference (tokens every mode is compared with) is the first listed
        unknown = [m for m in args.modes.split(",") if m not in modes]
        if unknown:
            parser.error(f"--modes: unknown {unknown}; these options give {sorted(modes)}")
        modes = {m: modes[m] for m in args.modes.split(",")}
    weight_bytes = sum(p.numel() * p.element_size() for p in target.module.parameters())
    ceiling_s = weight_bytes / copy_bandwidth(device) if device.type == "cuda" else None
    times: dict[str, list[float]] = {name: [] for name in modes}
    rows, reference, match = [], None, {}
    with torch.inference_mode():
        for name, run in modes.items():
            started = time.perf_counter()
            run()  # warm-up: compiles, captures, and settles the clocks
            warm_up = time.perf_counter() - started
            # a first look, printed, not counted: a run cut short still says what every mode it reached measured
            print(f"warm-up {name}: {warm_up:.1f} s; first look {run()[1] * 1e3:.3f} ms/token", flush=True)
        for _ in range(args.rounds):
            for name, run in modes.items():
                tokens, seconds = run()
                times[name].append(seconds)
                print(f"round {len(times[name])} {name}: {seconds * 1e3:.3f} ms/token", flush=True)
                reference = reference or tokens
                same = min(len(tokens), len(reference))
                match[name] = (match.get(name, (True,))[0] and tokens[:same] == reference[:same], same)
    for name, seconds in times.items():
        median = statistics.median(seconds)
        rows.append({"mode": name, "ms_per_token": median * 1e3, "ms_per_token_rounds": [t * 1e3 for t in seconds],
                     "fraction_of_ceiling": ceiling_s / median if ceiling_s else None,
                     "tokens_match_loop": match[name][0], "tokens": match[name][1]})
    figures = {"dtype": dtype, "device": str(device), "new_tokens": args.new_tokens, "prompt_tokens": args.prompt_tokens,
               "rounds": args.rounds,
               "weight_bytes": weight_bytes, "ceiling_ms": ceiling_s * 1e3 if ceiling_s else None, "modes": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out / "plain_headroom.json", json.dumps(figures, indent=2) + "\n")
    wide = max(len(row["mode"]) for row in rows)
    print(f"{'mode':{wide}} {'ms/token':>9} {'of ceiling':>10}  tokens match the loop's")
    for row in rows:
        share = f"{row['fraction_of_ceiling']:.3f}" if row["fraction_of_ceiling"] else "-"
        print(f"{row['mode']:{wide}} {row['ms_per_token']:9.3f} {share:>10}  {row['tokens_match_loop']} ({row['tokens']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
