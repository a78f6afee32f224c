"""Where one batched verify step's GPU time goes as B grows: the step's replayed time and its kernels by kind.

For each batch size B the static engine's plain step (width 1 per slot) and chain step (width K + 1)
are timed as decoding replays them (CUDA graphs, every slot active, ``measure_step_costs``'s medians),
then the same steps run eagerly under torch.profiler over the same module and cache, so every kernel shows
up by name. Kernels are summed per step into kinds: matmul, attention, KV write (the index/scatter kernels),
and the rest; the top kernels are listed as well. The cache holds ``--context`` entries per slot, as a run of
``--prompt-len`` prompts and ``--new-tokens`` new tokens would reserve. Writes OUT_DIR/batched_kernels.json
atomically and prints a table.

    python bench/profile_batched_kernels.py OUT_DIR --synth-dir SYNTH_DIR [--batch-sizes 1,8,32] [--k 3] [--reps 10]
    python bench/profile_batched_kernels.py OUT_DIR --tiny --device cpu --batch-sizes 1,2     # CPU smoke test
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench_target import add_target_arguments, load_target  # noqa: E402
from _phase_clock import sync, timed_calls  # noqa: E402

from specbench.io.atomic_write import write_text_atomic  # noqa: E402
from specbench.engine.static_cache import attention_span  # noqa: E402
from specbench.cli.arguments import list_argument_type  # noqa: E402
from specbench.engine.step_inputs import SlotInput, slot_input  # noqa: E402
from specbench.engine.draft import Draft  # noqa: E402
from specbench.engine.static_target import StaticTarget  # noqa: E402
from specbench.run.step_costs import measure_step_costs  # noqa: E402
from specbench.env import environment_fingerprint  # noqa: E402

# (kind, substrings of a kernel's name that put it there), the first match wins
KINDS = (
    ("l2_prefetch", ("_touch",)),  # bench/_l2_prefetch.py's reads of the next weight into L2, on a side stream
    ("attention", ("fmha", "attention", "flash", "softmax", "attn")),
    ("matmul", ("gemm", "gemv", "cutlass", "nvjet", "xmma", "cublas", "splitk", "matmul", "addmm", "_mm_")),
    ("kv_write", ("index_put", "index_elementwise", "scatter")),  # advanced-index writes (and reads) of the cache
)


def kind_of(name: str) -> str:
    lowered = name.lower()
    for kind, needles in KINDS:
        if any(n in lowered for n in needles):
            return kind
    return "other"


def prefilled(target: StaticTarget, prompts: list[torch.Tensor]) -> list[int]:
    """Every slot prefilled with its prompt (group prefill); each slot's root token (its greedy first output)."""
    outputs = target.prefill_many(list(range(target.batch_size)), prompts)
    return [int(out.logits[-1].argmax()) for out in outputs]


def kernel_profile(target: StaticTarget, inputs: list[SlotInput], steps: int) -> dict:
    """The kernels of ``steps`` eager verify + commit cycles (each truncated back), per step, by kind and by name."""
    lengths = {b: target.cache_length(b) for b in range(target.batch_size)}
    cycle = lambda: (target.verify(inputs), target.commit([[0]] * target.batch_size), target.truncate(lengths))  # noqa: E731
    return profiled(target.device, cycle, steps)


def profiled(device: torch.device, cycle, steps: int) -> dict:
    """``cycle()`` once to warm, then ``steps`` times under torch.profiler: its CUDA kernels per call, by kind and name."""
    from torch.profiler import ProfilerActivity, profile

    cycle()  # warm: allocator, kernels chosen
    sync(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            cycle()
        sync(device)
    by_name: dict[str, list] = {}
    for event in prof.key_averages():
        if getattr(event, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        total = getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0)
        entry = by_name.setdefault(event.key, [0.0, 0])
        entry[0] += total / 1e3 / steps  # ms per step
        entry[1] += event.count / steps
    by_kind: dict[str, float] = {}
    for name, (ms, _) in by_name.items():
        by_kind[kind_of(name)] = by_kind.get(kind_of(name), 0.0) + ms
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:12]
    return {"kernel_ms_per_step": sum(ms for ms, _ in by_name.values()),
            "kernels_per_step": sum(n for _, n in by_name.values()),
            "by_kind_ms": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
            "top": [{"kernel": name[:120], "ms_per_step": ms, "calls_per_step": n} for name, (ms, n) in top]}


def measure(static: StaticTarget, batch: int, prompts: list, args) -> dict:
    point: dict = {"batch_size": batch}
    graphed = static.with_batch_size(batch)  # the weights shared
    graphed.reserve(args.context, args.k)
    chain = _Chain(args.k)
    costs = measure_step_costs(graphed, chain, prompts, reps=args.reps)
    point["replayed"] = {"t1_ms": costs.t1_s * 1e3, "chain_ms": costs.verify_s * 1e3, "chain_width": costs.verify_width,
                         "cuda_graphs": graphed.cuda_graphs}
    del graphed
    eager = static.with_batch_size(batch, cuda_graphs=False)
    eager.reserve(args.context, args.k)
    roots = prefilled(eager, [prompts[b % len(prompts)] for b in range(batch)])
    point["eager_plain"] = kernel_profile(eager, [SlotInput([r], [0]) for r in roots], args.profile_steps)
    drafts = [slot_input(r, Draft.chain(torch.full((args.k,), r, dtype=torch.long)), static.device) for r in roots]
    point["eager_chain"] = kernel_profile(eager, drafts, args.profile_steps)
    point["group_prefill"] = group_prefill(eager, [prompts[b % len(prompts)] for b in range(batch)], args.reps)
    point["attention_ms_per_layer"] = {f"w{w}": attention_variants(batch, w, args.context, static.module.shape, eager.dtype,
                                                                   static.device, args.reps) for w in (1, args.k + 1)}
    return point


def group_prefill(target: StaticTarget, prompts: list[torch.Tensor], reps: int) -> dict:
    """An admission of every slot at once (``prefill_many``, eager): its wall time (median of ``reps``, device
    synchronised) and its kernels by kind."""
    slots = list(range(target.batch_size))

    def admit():
        for slot in slots:
            target.release(slot)
        target.prefill_many(slots, prompts)

    times = timed_calls(target.device, admit, reps)
    return {"tokens": sum(p.numel() for p in prompts), "wall_ms": statistics.median(times) * 1e3,
            **profiled(target.device, admit, 2)}


class _Chain:
    """A slot proposer drafting K copies of each slot's last token (the step's cost does not depend on them)."""

    needs_hidden_states = False

    def __init__(self, k: int):
        self.max_draft_tokens = k

    def begin_request(self, slot, prompt_ids) -> None:
        pass

    def propose(self, states):
        return {b: Draft.chain(s.token_ids[-1:].cpu().repeat(self.max_draft_tokens)) for b, s in states.items()}


def attention_variants(batch: int, width: int, context: int, shape, dtype, device, reps: int) -> dict:
    """One layer's decode attention at (B, W) over ``context`` cache entries per slot, ms per call (median of
    ``reps``): SDPA with an additive bias over the whole cache and over the step's attention span (what the
    step runs: engine/static_cache.attention_span), SDPA's math backend, a plain matmul-softmax-matmul, and
    SDPA without a mask over all entries."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn import functional as F

    heads, dim = shape.num_heads, shape.head_dim
    q = torch.randn(batch, heads, width, dim, dtype=dtype, device=device)  # (B, NH, W, D)
    k, v = (torch.randn(batch, heads, context, dim, dtype=dtype, device=device) for _ in range(2))  # (B, NH, S, D)
    generator = torch.Generator().manual_seed(batch)
    lengths = torch.randint(context // 2, context - width, (batch,), generator=generator).to(device)  # (B,) ragged
    span = attention_span(int(lengths.max()) + width, context)
    allowed = torch.arange(context, device=device)[None, None] < (lengths[:, None, None] + width)  # (B, 1, S)
    bias = torch.zeros(batch, 1, width, context, dtype=dtype, device=device).masked_fill_(~allowed[:, None], float("-inf"))

    def matmul():
        scores = (q @ k.transpose(-1, -2)).float() * dim ** -0.5 + bias  # (B, NH, W, S)
        return scores.softmax(-1).to(dtype) @ v  # (B, NH, W, D)

    def math_backend():
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)

    variants = {"sdpa_bias": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias),
                "sdpa_bias_span": lambda: F.scaled_dot_product_attention(q, k[:, :, :span], v[:, :, :span],
                                                                         attn_mask=bias[..., :span]),
                "sdpa_math": math_backend, "matmul_softmax": matmul,
                "sdpa_no_mask": lambda: F.scaled_dot_product_attention(q, k, v)}
    out = {}
    for name, fn in variants.items():
        fn()
        times = []
        for _ in range(reps):
            sync(device)
            start = time.perf_counter()
            for _ in range(10):
                fn()
            sync(device)
            times.append((time.perf_counter() - start) / 10)
        out[name] = statistics.median(times) * 1e3
    return out


def table(report: dict) -> str:
    lines = [f"{'B':>3} {'T(1) ms':>8} {'T(K+1)':>7} | eager kernels per step (ms): plain / chain by kind"]
    for p in report["points"]:
        kinds = sorted(set(p["eager_plain"]["by_kind_ms"]) | set(p["eager_chain"]["by_kind_ms"]))
        cells = "  ".join(f"{k} {p['eager_plain']['by_kind_ms'].get(k, 0):.2f}/{p['eager_chain']['by_kind_ms'].get(k, 0):.2f}"
                          for k in kinds)
        lines.append(f"{p['batch_size']:>3} {p['replayed']['t1_ms']:8.3f} {p['replayed']['chain_ms']:7.3f} | "
                     f"total {p['eager_plain']['kernel_ms_per_step']:.2f}/{p['eager_chain']['kernel_ms_per_step']:.2f}  {cells}")
        for row in p["eager_plain"]["top"][:6]:
            lines.append(f"      plain {row['ms_per_step']:7.3f} ms x{row['calls_per_step']:5.0f}  {row['kernel'][:90]}")
        for w, ms in p["attention_ms_per_layer"].items():
            lines.append(f"      attention per layer, {w}: " + "  ".join(f"{name} {t:.3f}" for name, t in ms.items()))
        g = p["group_prefill"]
        lines.append(f"      group prefill of {g['tokens']} tokens: {g['wall_ms']:.1f} ms wall, kernels {g['kernel_ms_per_step']:.1f} ms: "
                     + "  ".join(f"{k} {ms:.1f}" for k, ms in g["by_kind_ms"].items()))
        for row in g["top"][:6]:
            lines.append(f"      prefill {row['ms_per_step']:7.3f} ms x{row['calls_per_step']:5.0f}  {row['kernel'][:90]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", help="where batched_kernels.json is written (atomically)")
    add_target_arguments(parser)
    parser.add_argument("--batch-sizes", type=list_argument_type("batch_size"), default="1,8,32",
                        help="comma-separated distinct batch sizes >= 1 (default 1,8,32)")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--context", type=int, default=259, help="cache entries per slot (default 259: 128 + 128 + K)")
    parser.add_argument("-k", "--k", type=int, default=3, help="draft tokens of the chain step")
    parser.add_argument("--reps", type=int, default=20, help="timed replays per step cost (median kept)")
    parser.add_argument("--profile-steps", type=int, default=10, help="eager steps under the profiler per point")
    args = parser.parse_args(argv)
    if min(args.k, args.reps, args.profile_steps, args.prompt_len) < 1 or args.context < args.prompt_len + args.k + 1:
        parser.error("-k, --reps, --profile-steps and --prompt-len must be >= 1, --context >= prompt-len + k + 1")
    device = torch.device(args.device)
    static, dtype = load_target(args)
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, static.vocab_size, (args.prompt_len,), generator=generator) for _ in range(8)]
    report = {"env": environment_fingerprint(device=str(device), dtype=dtype),
              "settings": {k: v for k, v in vars(args).items() if k != "out_dir"}, "points": []}
    for batch in sorted(args.batch_sizes):
        report["points"].append(measure(static, batch, prompts, args))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    report["table"] = table(report)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "batched_kernels.json", json.dumps(report, indent=2, default=str) + "\n")
    print(report["table"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
