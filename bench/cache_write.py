"""How long does a verify step's rotary stage plus its cache write take per layer, written three ways? The cache
write's `scatter_` took 4.7 us per layer in the 2026-12-05b profile (bench/results/h200-2026-12-05b/), as much as
the whole attention kernel saves with Triton, so this is the next candidate on plain decoding's way to 0.80 of the
ceiling (docs/engines.md). 32 layers of the Vicuna-7B shape (32 heads of 128, bf16) over one cache tensor
(layers, 2, B, KVH, S, D), as the engine holds it, replayed as one CUDA graph:
  scatter     the engine's way up to c62d24a: the compiled rotation, then one scatter_ into the layer's cache view
  index-copy  the compiled rotation, then index_copy_ into the layer's cache flattened to rows, through row
              numbers computed once per step (their cost is counted once, not per layer)
  fused       the engine's way since: static_ops.rope_into_cache compiled, the write an indexed put in its kernel
Each way's cache and q are compared with the engine's. Prints microseconds per layer and the compiled functions'
recompilations, writes OUT/cache_write.json.

    python bench/cache_write.py OUT [--widths 1,4,64] [--batch-sizes 1,8] [--reps 50]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _phase_clock import graph_replay_seconds  # noqa: E402
from attention_backends import kernel_bench  # noqa: E402
from specbench.engine.static_ops import rope_into_cache, rotate_heads  # noqa: E402
from specbench.io.atomic_write import write_text_atomic  # noqa: E402

LAYERS, HEADS, HEAD_DIM, SPAN = 32, 32, 128, 512


def scatter_write(kv, slots, kv_new):
    """The engine's write (engine/static_llama.py): ``kv`` (2, B, KVH, S, D), ``slots`` (B, W), ``kv_new``
    (2, KVH, B * W, D)."""
    two, batch, kvh, _, d = kv.shape
    width = slots.shape[1]
    where = slots[None, :, None, :, None].expand(2, batch, kvh, width, d)  # (2, B, KVH, W, D)
    kv.scatter_(3, where, kv_new.view(2, kvh, batch, width, d).transpose(1, 2))


def rope_qkv(qkv, cos, sin):
    """The rotation as the engine's stage computed it up to c62d24a: q (1, NH, B * W, D), k and v stacked
    (2, KVH, B * W, D)."""
    q, k, v = rotate_heads(qkv, cos, sin, HEADS, HEADS)
    return q.unsqueeze(0).contiguous(), torch.stack((k, v))


def main() -> int:
    args, out = kernel_bench(__doc__)
    dev, dtype = torch.device("cuda"), torch.bfloat16
    rope, fused_write = torch.compile(rope_qkv, fullgraph=True), torch.compile(rope_into_cache, fullgraph=True)
    rows = []
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        cache = torch.zeros(LAYERS, 2, batch, HEADS, SPAN, HEAD_DIM, device=dev, dtype=dtype)
        for width in [int(w) for w in args.widths.split(",")]:
            qkv = torch.randn(batch * width, 3 * HEADS * HEAD_DIM, device=dev, dtype=dtype)
            cos, sin = (torch.randn(batch * width, HEAD_DIM, device=dev, dtype=dtype) for _ in range(2))
            slots = (torch.arange(width, device=dev) + 100 + 7 * torch.arange(batch, device=dev)[:, None])  # (B, W)

            def by_scatter():
                for layer in range(LAYERS):
                    q, kv_new = rope(qkv, cos, sin)
                    scatter_write(cache[layer], slots, kv_new)
                return q

            def by_index_copy():
                heads = torch.arange(batch * HEADS, device=dev).view(batch, HEADS, 1) * SPAN  # (B, KVH, 1)
                index = (heads + slots[:, None, :]).flatten()  # (B * KVH * W,) once per step
                for layer in range(LAYERS):
                    q, kv_new = rope(qkv, cos, sin)
                    values = kv_new.view(2, HEADS, batch, width, HEAD_DIM).transpose(1, 2)  # (2, B, KVH, W, D)
                    cache[layer].view(2, -1, HEAD_DIM).index_copy_(1, index, values.reshape(2, -1, HEAD_DIM))
                return q

            def by_fused():
                for layer in range(LAYERS):
                    q = fused_write(qkv, cos, sin, HEADS, HEADS, cache[layer], slots)
                return q

            expected = None
            for name, step in (("scatter", by_scatter), ("index-copy", by_index_copy), ("fused", by_fused)):
                cache.zero_()
                q = step()
                same = expected is None or (torch.equal(q, expected[0]) and torch.equal(cache, expected[1]))
                expected = expected or (q.clone(), cache.clone())
                before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
                seconds = graph_replay_seconds(step, args.reps)
                row = {"way": name, "batch": batch, "width": width, "us_per_layer": seconds / LAYERS * 1e6,
                       "equal_to_scatter": same,
                       "graphs_compiled_while_timed": torch._dynamo.utils.counters["stats"]["unique_graphs"] - before}
                rows.append(row)
                print(f"B={batch:2d} W={width:3d} {name:11s} {row['us_per_layer']:6.2f} us/layer  equal {same}  "
                      f"compiled graphs {torch._dynamo.utils.counters['stats']['unique_graphs']}", flush=True)
    write_text_atomic(out / "cache_write.json", json.dumps({"rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
