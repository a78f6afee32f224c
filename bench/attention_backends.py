"""How long does the static engine's attention take per layer at its verify shapes, per backend? Part of the profile
behind plain decoding's distance from the copy-bandwidth ceiling (docs/engines.md): 32 layers' attention over
distinct caches (the Vicuna-7B shape: 32 heads of 128, bf16), replayed as one CUDA graph, with the engine's additive
bias over a span of K cache entries, for each backend:
  sdpa            F.scaled_dot_product_attention as the engine calls it (the dispatcher picks; cuDNN on an H200)
  sdpa-efficient  the same, forced to the memory-efficient kernel
  compiled-math   softmax(q k^T / sqrt(D) + bias) v through torch.compile (Inductor's kernels)
  triton          bench/_decode_attention.py: one online-softmax kernel per layer
Each backend's output is compared with fp32 math attention. Prints microseconds per layer, writes
OUT/attention_backends.json.

    python bench/attention_backends.py OUT [--spans 96,256] [--widths 1,4,64] [--batch-sizes 1,8] [--reps 50]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _phase_clock import graph_replay_seconds  # noqa: E402
from specbench.io.atomic_write import write_text_atomic  # noqa: E402

LAYERS, HEADS, HEAD_DIM = 32, 32, 128


def _math(q, keys, values, bias):
    scores = q @ keys.transpose(-1, -2) * HEAD_DIM ** -0.5 + bias[:, None]  # (B, NH, W, K)
    return torch.softmax(scores.float(), dim=-1).to(q.dtype) @ values  # (B, NH, W, D)


def _efficient(q, keys, values, bias):
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=bias[:, None])


def backends() -> dict:
    found = {"sdpa": lambda q, k, v, bias: F.scaled_dot_product_attention(q, k, v, attn_mask=bias[:, None]),
             "sdpa-efficient": _efficient,
             "compiled-math": torch.compile(_math, dynamic=False)}
    try:
        from _decode_attention import attend
        found["triton"] = attend
    except ImportError as err:  # no Triton on this machine
        print(f"triton: left out ({err})", flush=True)
    return found


def kernel_bench(description: str, parser: argparse.ArgumentParser | None = None) -> tuple[argparse.Namespace, Path]:
    """(arguments, output directory made) of a per-layer kernel bench: OUT, --widths, --batch-sizes, --reps, and
    ``parser``'s own; seeds torch and lets dynamo compile a function for every shape."""
    parser = parser or argparse.ArgumentParser(description=description,
                                               formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--widths", default="1,4,64")
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    torch._dynamo.config.recompile_limit = 256
    return args, out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", default="96,256")
    args, out = kernel_bench(__doc__, parser)
    dev, dtype = torch.device("cuda"), torch.bfloat16
    rows = []
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        for span in [int(k) for k in args.spans.split(",")]:
            caches = [torch.randn(2, batch, HEADS, span + 64, HEAD_DIM, device=dev, dtype=dtype) for _ in range(LAYERS)]
            for width in [int(w) for w in args.widths.split(",")]:
                q = torch.randn(batch, HEADS, width, HEAD_DIM, device=dev, dtype=dtype)  # (B, NH, W, D)
                bias = torch.zeros(batch, width, span, device=dev, dtype=dtype)  # (B, W, K)
                bias[:, :, span - width // 2 - 3:] = float("-inf")  # the span's tail: past the sequence's length
                views = [(c[0, :, :, :span], c[1, :, :, :span]) for c in caches]  # (B, NH, K, D) each
                reference = _math(q.float(), views[0][0].float(), views[0][1].float(), bias.float())
                for name, attend in backends().items():
                    error = (attend(q, *views[0], bias).float() - reference).abs().max().item()
                    seconds = graph_replay_seconds(lambda: [attend(q, k, v, bias) for k, v in views], args.reps)
                    row = {"backend": name, "batch": batch, "span": span, "width": width,
                           "us_per_layer": seconds / LAYERS * 1e6, "max_abs_error": error}
                    rows.append(row)
                    print(f"B={batch:2d} K={span:5d} W={width:3d} {name:15s} {row['us_per_layer']:7.2f} us/layer  "
                          f"max |error| {error:.3g}", flush=True)
    write_text_atomic(out / "attention_backends.json", json.dumps({"rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
